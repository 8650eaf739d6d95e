"""The HTTP transport against other local users and against floods (issue 21, defects 4 and 9).

- Loopback is no trust boundary: a server started as root on 127.0.0.1 without a token refuses a request from a
  process of the user nobody (403, before any MCP handling: no initialize, no tools/call even with a session id that
  root's client got), and serves root; with a token set, nobody is served with the token. The peer's user comes from
  /proc/net/tcp (servers.core.transport.peer_uid), checked here against real sockets of root and of nobody. These
  tests run the client as nobody (subprocess with user=nobody) and skip when the tests do not run as root.
- Slowloris: connections that never complete their headers are closed after the header timeout (408 when some
  bytes came), a flood of them above the connection limit does not keep a real initialize from being answered, a
  request is refused (503) only when every connection is in a request, and the log stays a few summary lines.
- The parts in process: the rate-limited log filter, the connection limit under a small RLIMIT_NOFILE, the token
  file a system without /proc/net/tcp gets.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.server import MCPServer

from servers.core import transport
from servers.core.transport import (
    LocalUserMiddleware,
    PeerUnknownError,
    RateLimitFilter,
    TransportConfigError,
    http_app,
    load_or_create_token,
    peer_uid,
)
from tests.conftest import PYTHON, REPO_ROOT, server_env
from tests.test_http import INITIALIZE, MCP_HEADERS, TOKEN, serve_command, serving

LINUX = sys.platform.startswith("linux")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _nobody() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


NOBODY = _nobody()
# A client that needs only the standard library, so that it runs as nobody from an interpreter nobody may run.
CLIENT = r"""
import json, os, sys, urllib.error, urllib.request
url, body, headers = sys.argv[1], sys.argv[2].encode(), json.loads(sys.argv[3])
request = urllib.request.Request(url, data=body, headers=headers, method="POST")
try:
    with urllib.request.urlopen(request, timeout=20) as response:
        status, text = response.status, response.read().decode()
except urllib.error.HTTPError as exc:
    status, text = exc.code, exc.read().decode()
print(json.dumps({"uid": os.getuid(), "status": status, "body": text}))
"""


def _run_as(uid: int, gid: int, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        user=uid,
        group=gid,
        extra_groups=[],
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "no_proxy": "*"},
        capture_output=True,
        text=True,
        timeout=60,
        **kwargs,
    )


def _python_for_nobody() -> str | None:
    if not (IS_ROOT and NOBODY and LINUX):
        return None
    for candidate in (PYTHON, "/usr/bin/python3"):
        try:
            if _run_as(NOBODY.pw_uid, NOBODY.pw_gid, [candidate, "-c", "pass"]).returncode == 0:
                return candidate
        except OSError:
            continue
    return None


NOBODY_PYTHON = _python_for_nobody()
needs_nobody = pytest.mark.skipif(
    NOBODY_PYTHON is None,
    reason="needs Linux, the tests running as root, and a user nobody that can run a Python interpreter",
)


def post_as_nobody(url: str, message: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
    assert NOBODY is not None and NOBODY_PYTHON is not None
    done = _run_as(
        NOBODY.pw_uid,
        NOBODY.pw_gid,
        [NOBODY_PYTHON, "-c", CLIENT, url, json.dumps(message), json.dumps({**MCP_HEADERS, **(headers or {})})],
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["uid"] == NOBODY.pw_uid
    return answer


def tools_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


@pytest.fixture
def secret_log(tmp_path: Path) -> Path:
    """A kernel log only root may read, inside the server's roots (the reviewer's file)."""
    path = tmp_path / "roots" / "kern.log"
    path.parent.mkdir()
    path.write_text(
        "Jan 1 00:00:00 node kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, "
        "GPU has fallen off the bus. SECRET-LINE-42\n"
    )
    path.chmod(0o600)
    return path


def suite_server(tmp_path: Path, roots: Path, **extra_env: str) -> Any:
    """`llm-infra-mcp serve suite --transport http` on 127.0.0.1 (as this user: root), its roots `roots`."""
    env = server_env(tmp_path / "state", LLM_INFRA_MCP_ALLOWED_ROOTS=str(roots), **extra_env)
    return serving(lambda port: serve_command("127.0.0.1", port), env, tmp_path)


# ---- defect 4: another local user ------------------------------------------------------------------------------


@needs_nobody
@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_another_user_is_refused_on_loopback_and_the_servers_user_is_served(
    tmp_path: Path, secret_log: Path
) -> None:
    assert NOBODY is not None
    with suite_server(tmp_path, secret_log.parent) as url:
        # root (the user that runs the server): the reviewer's tools/call reads the root-only file
        async with Client(url + "/mcp") as client:
            result = await client.call_tool("scan_kernel_log", {"path": str(secret_log)})
            assert not result.is_error, result.content
            assert "SECRET-LINE-42" in json.dumps(result.structured_content)
        with httpx.Client(timeout=20) as http:  # a session of root's, whose id nobody then tries
            first = http.post(url + "/mcp", json=INITIALIZE, headers=MCP_HEADERS)
            assert first.status_code == 200 and '"serverInfo"' in first.text
            session_id = first.headers.get("mcp-session-id")
            assert session_id

        # nobody: refused before MCP sees the request, whatever it sends
        refused = post_as_nobody(url + "/mcp", INITIALIZE)
        assert refused["status"] == 403, refused
        error = json.loads(refused["body"])
        assert error["error"] == "forbidden"
        description = error["error_description"]
        assert f"uid {NOBODY.pw_uid}" in description and "uid 0" in description
        assert "Authorization: Bearer" in description and "LLM_INFRA_MCP_HTTP_TOKEN" in description
        stolen = post_as_nobody(
            url + "/mcp",
            tools_call("scan_kernel_log", {"path": str(secret_log)}),
            {"mcp-session-id": session_id, "mcp-protocol-version": "2025-06-18"},
        )
        assert stolen["status"] == 403 and "SECRET-LINE-42" not in stolen["body"], stolen
        launch = post_as_nobody(url + "/mcp", tools_call("submit_training_job", {"spec": {"recipe": "tiny-gpt"}}))
        assert launch["status"] == 403
        log = (tmp_path / f"server-{url.rsplit(':', 1)[1]}.log").read_text()
        assert "refused a request on loopback from another user" in log
        assert "at most 512 connections, 10 s for a request's headers" in log  # the CLI's defaults


@needs_nobody
@pytest.mark.timeout(120)
def test_with_a_token_another_user_is_served_on_loopback(tmp_path: Path, secret_log: Path) -> None:
    with suite_server(tmp_path, secret_log.parent, LLM_INFRA_MCP_HTTP_TOKEN=TOKEN) as url:
        with_token = post_as_nobody(url + "/mcp", INITIALIZE, {"Authorization": f"Bearer {TOKEN}"})
        assert with_token["status"] == 200 and '"serverInfo"' in with_token["body"], with_token
        wrong = post_as_nobody(url + "/mcp", INITIALIZE, {"Authorization": "Bearer wrong"})
        assert wrong["status"] == 401 and json.loads(wrong["body"])["error"] == "unauthorized"
        without = post_as_nobody(url + "/mcp", INITIALIZE)
        assert without["status"] == 403
        with httpx.Client(timeout=20) as http:  # the server's own user needs no token
            mine = http.post(url + "/mcp", json=INITIALIZE, headers=MCP_HEADERS)
        assert mine.status_code == 200


@pytest.mark.skipif(not LINUX, reason="/proc/net/tcp is Linux's")
@pytest.mark.parametrize("family, host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_peer_uid_is_the_owner_of_the_connecting_socket(family: int, host: str) -> None:
    try:
        listener = socket.socket(family)
        listener.bind((host, 0))
    except OSError:
        pytest.skip(f"no {host} here")
    with listener:
        listener.listen()
        client = socket.create_connection(listener.getsockname()[:2])
        served, address = listener.accept()
        with served:
            assert peer_uid(address[:2], served.getsockname()[:2]) == os.geteuid()
            client.close()  # its row now lists no owner (uid 0, inode 0): that is no proof of anybody
            with pytest.raises(PeerUnknownError, match="no process on this machine holds the socket"):
                peer_uid(address[:2], served.getsockname()[:2])


@needs_nobody
def test_peer_uid_names_nobody_for_a_socket_of_nobody() -> None:
    assert NOBODY is not None and NOBODY_PYTHON is not None
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        hold = (
            "import socket, sys; s = socket.create_connection(('127.0.0.1', int(sys.argv[1]))); "
            "s.sendall(b'x'); s.recv(1)"
        )
        proc = subprocess.Popen(
            [NOBODY_PYTHON, "-c", hold, str(port)],
            user=NOBODY.pw_uid,
            group=NOBODY.pw_gid,
            extra_groups=[],
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
        )
        try:
            listener.settimeout(20)
            served, address = listener.accept()
            with served:
                served.settimeout(20)
                assert served.recv(1) == b"x"
                assert peer_uid(address, served.getsockname()) == NOBODY.pw_uid
                served.sendall(b"y")
        finally:
            proc.wait(timeout=20)


@pytest.mark.anyio
async def test_a_forwarded_client_address_is_not_believed() -> None:
    """Under an ASGI server whose proxy-headers middleware rewrites scope["client"] from X-Forwarded-For, the peer
    address cannot be believed: such a request is refused unless it carries the token."""
    reached: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["type"])

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    guard = LocalUserMiddleware(app, TOKEN, uids={os.geteuid()})
    scope = {
        "type": "http",
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
        "headers": [(b"x-forwarded-for", b"127.0.0.1:1")],
    }
    await guard(scope, receive, send)
    assert not reached and sent[0]["status"] == 403
    assert b"forwarded client" in sent[1]["body"]
    await guard(
        {**scope, "headers": [*scope["headers"], (b"authorization", f"Bearer {TOKEN}".encode())]}, receive, send
    )
    assert reached == ["http"]


def test_without_proc_net_tcp_loopback_needs_a_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(transport, "peer_uid_supported", lambda *_: False)
    with pytest.raises(TransportConfigError, match="LLM_INFRA_MCP_HTTP_TOKEN"):
        http_app(MCPServer("t"), "127.0.0.1", None)
    assert isinstance(http_app(MCPServer("t"), "127.0.0.1", TOKEN), transport.BearerTokenMiddleware)
    # serve_http then makes a token, kept 0600 in the state directory, and keeps it
    path = tmp_path / "state" / "http-token"
    token = load_or_create_token(path)
    assert len(token) >= 32 and path.stat().st_mode & 0o777 == 0o600
    assert load_or_create_token(path) == token
    path.chmod(0o644)
    with pytest.raises(TransportConfigError, match="chmod 600"):
        load_or_create_token(path)


# ---- defect 9: slowloris --------------------------------------------------------------------------------------

SERVE_GUARDED = (  # logging set up as `llm-infra-mcp serve` does (one plain line per record), before the SDK's own
    # setup, which uses rich's wrapping handler when rich is installed (mlflow and wandb bring it)
    "import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr, "
    "format='%(asctime)s %(name)s %(levelname)s %(message)s'); "
    "from mcp.server import MCPServer; from servers.core.transport import serve_http; "
    "serve_http(MCPServer('t'), '127.0.0.1', int(sys.argv[1]), None, header_timeout_s=float(sys.argv[2]), "
    "max_connections=int(sys.argv[3]))"
)
PARTIAL = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"


def guarded_server(tmp_path: Path, header_timeout_s: float, max_connections: int) -> Any:
    argv = lambda port: [PYTHON, "-c", SERVE_GUARDED, str(port), str(header_timeout_s), str(max_connections)]  # noqa: E731
    return serving(argv, server_env(tmp_path / "state"), tmp_path)


def open_partial(port: int, n: int, head: bytes = PARTIAL) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if head:
            sock.sendall(head)
        sock.setblocking(False)
        socks.append(sock)
    return socks


def wait_closed(
    socks: list[socket.socket], limit_s: float, trickle_s: float | None = None, trickled: int = 0
) -> dict[int, tuple[float, bytes]]:
    """Read every socket until the server closes it (or limit_s): {index: (seconds until closed, bytes read)};
    with trickle_s, send one more header byte that often on each of the first `trickled` sockets still open (the
    slowloris way)."""
    selector = selectors.DefaultSelector()
    start = time.monotonic()
    got: dict[int, bytes] = {}
    closed: dict[int, tuple[float, bytes]] = {}
    for i, sock in enumerate(socks):
        selector.register(sock, selectors.EVENT_READ, i)
        got[i] = b""
    next_trickle = start + (trickle_s or 0)
    while len(closed) < len(socks) and time.monotonic() - start < limit_s:
        for key, _ in selector.select(timeout=0.05):
            i = key.data
            try:
                chunk = socks[i].recv(65536)
            except (ConnectionResetError, BlockingIOError) as exc:
                if isinstance(exc, BlockingIOError):
                    continue
                chunk = b""
            if chunk:
                got[i] += chunk
                continue
            closed[i] = (time.monotonic() - start, got[i])
            selector.unregister(socks[i])
        if trickle_s is not None and time.monotonic() >= next_trickle:
            next_trickle += trickle_s
            for i, sock in enumerate(socks[:trickled]):
                if i not in closed:
                    with contextlib.suppress(OSError):
                        sock.send(b"X")
    selector.close()
    return closed


def close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()


def http_lines(log: Path) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines() if line.strip()]


@pytest.mark.timeout(60)
def test_headers_that_never_complete_are_closed_after_the_header_timeout(tmp_path: Path) -> None:
    with guarded_server(tmp_path, 1.0, 64) as url:
        port = int(url.rsplit(":", 1)[1])
        trickling = open_partial(port, 30)
        silent = open_partial(port, 10, head=b"")
        try:
            closed = wait_closed(trickling + silent, limit_s=8, trickle_s=0.2, trickled=len(trickling))
        finally:
            close_all(trickling + silent)
        assert len(closed) == 40, f"{40 - len(closed)} connections still open after 8 s"
        for i, (after_s, data) in closed.items():
            assert 0.7 <= after_s <= 4.0, (i, after_s)
            if i < 30:  # a client that sent part of a request is told why
                assert data.startswith(b"HTTP/1.1 408") and b"request_timeout" in data, data[:200]
            else:
                assert data == b""
        with httpx.Client(timeout=10) as http:
            assert http.post(url + "/mcp", json=INITIALIZE, headers=MCP_HEADERS).status_code == 200
        time.sleep(1.5)  # the summary of a burst comes a second after its first close
    lines = http_lines(next(tmp_path.glob("server-*.log")))
    summaries = [line for line in lines if "sent no complete request headers" in line]
    assert len(summaries) == 1 and "closed 40 connection(s)" in summaries[0], lines


@pytest.mark.timeout(90)
def test_a_flood_of_unfinished_headers_does_not_keep_a_real_client_out(tmp_path: Path) -> None:
    """The reviewer's attack, scaled to this machine: many more connections with unfinished headers than the server
    takes. The ones it cannot hold are closed at once (the longest waiting first), so a real initialize is answered
    at once while the flood lasts; the log stays a few summary lines."""
    with guarded_server(tmp_path, 2.0, 64) as url:
        port = int(url.rsplit(":", 1)[1])
        flood: list[socket.socket] = []
        try:
            for _ in range(3):  # waves, so that the server holds its limit of them the whole time
                flood += open_partial(port, 100)
                started = time.monotonic()
                with httpx.Client(timeout=5) as http:
                    answer = http.post(url + "/mcp", json=INITIALIZE, headers=MCP_HEADERS)
                assert answer.status_code == 200 and '"serverInfo"' in answer.text
                assert time.monotonic() - started < 3, "the initialize waited behind the flood"
            closed = wait_closed(flood, limit_s=8)
        finally:
            close_all(flood)
        assert len(closed) == len(flood), f"{len(flood) - len(closed)} of {len(flood)} still open"
        with httpx.Client(timeout=10) as http:
            assert http.post(url + "/mcp", json=INITIALIZE, headers=MCP_HEADERS).status_code == 200
        time.sleep(0.3)
    log = next(tmp_path.glob("server-*.log"))
    lines = http_lines(log)
    about_connections = [line for line in lines if "session" not in line.lower() and "serving t" not in line]
    assert len(about_connections) <= 2 and log.stat().st_size < 4000, lines  # 300 connections, one line
    assert "to make room for new ones" in about_connections[0], lines


@pytest.mark.timeout(60)
def test_at_the_limit_with_every_connection_in_a_request_a_new_one_gets_503(tmp_path: Path) -> None:
    with guarded_server(tmp_path, 5.0, 2) as url:
        port = int(url.rsplit(":", 1)[1])
        body = json.dumps(INITIALIZE).encode()
        head = (
            f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        busy = open_partial(port, 2, head=head + body[:5])  # headers complete, the body still coming: in a request
        try:
            time.sleep(0.3)
            with socket.create_connection(("127.0.0.1", port), timeout=10) as third:
                third.settimeout(10)
                data = third.recv(65536)
            assert data.startswith(b"HTTP/1.1 503") and b"server_busy" in data, data[:200]
        finally:
            close_all(busy)
        time.sleep(0.3)
        with httpx.Client(timeout=10) as http:  # the busy ones gone, the server serves again
            assert http.post(url + "/mcp", json=INITIALIZE, headers=MCP_HEADERS).status_code == 200
    # the count not logged yet when the server stops is logged as it stops
    lines = http_lines(next(tmp_path.glob("server-*.log")))
    assert any("refused 1 connection(s) while every connection was in a request" in line for line in lines), lines


def test_the_log_filter_keeps_a_few_lines_and_counts_the_rest() -> None:
    now = [0.0]
    limiter = RateLimitFilter(burst=3, interval_s=10, clock=lambda: now[0])

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, msg, None, None)

    passed = [limiter.filter(record("Invalid HTTP request received.")) for _ in range(1000)]
    assert sum(passed) == 3
    assert limiter.filter(record("another message"))  # each message has its own budget
    now[0] = 10.5
    later = record("Invalid HTTP request received.")
    assert limiter.filter(later)
    assert "997 more like this in the 10 s before were not logged" in later.getMessage()


def test_the_connection_limit_fits_the_file_descriptors() -> None:
    check = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2]))); "
        "from servers.core.transport import connection_limit; "
        "print(connection_limit(512), resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )

    def run(soft: int, hard: int) -> list[int]:
        done = subprocess.run(
            [PYTHON, "-c", check, str(soft), str(hard)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
        return [int(v) for v in done.stdout.split()]

    assert run(300, 300) == [14, 300]  # (300 - 256 kept for the rest) // 3: never EMFILE on accept
    assert run(300, 4096) == [512, 3 * 512 + 256]  # the soft limit raised as far as needed, no further
    assert run(8192, 8192) == [512, 8192]
