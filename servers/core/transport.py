"""Serving a server over stdio or streamable HTTP.

HTTP binds 127.0.0.1 by default, where the SDK's DNS-rebinding protection (Host and Origin checks) is on.
On any other address a bearer token is required: without one the server refuses to start. Loopback is no trust
boundary on a shared machine: there a request is served when it comes from a process of the user that runs the
server (or of root, who can read that user's token anyway), or carries the bearer token when one is set; any other
local user gets 403 (LocalUserMiddleware: the peer socket's owner, from /proc/net/tcp). Where the system cannot tell
who connects (no /proc/net/tcp), a server on loopback without a token makes one, kept 0600 in the state directory.

Every connection has HEADER_TIMEOUT_S to send a request's headers (and BODY_TIMEOUT_S its body); at most
MAX_CONNECTIONS are open (fewer when the file descriptors would not suffice), and a new connection at the limit
closes the one that has waited longest for headers. Connections closed for either are logged as one summary line
per LOG_INTERVAL_S, and repeated log lines of the HTTP stack are rate-limited (RateLimitFilter).

Over stdio every line gets an answer: the lines the SDK would drop without one are answered here (StdinGuard).
"""

import asyncio
import contextlib
import functools
import hmac
import http
import io
import ipaddress
import json
import logging
import os
import re
import secrets
import socket
import stat
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import pydantic_core
from mcp.server import MCPServer
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.message import SessionMessage
from mcp.types import ErrorData, JSONRPCError, JSONRPCNotification, jsonrpc_message_adapter
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from servers.core import sdk

log = logging.getLogger(__name__)
LOOPBACK_NAMES = ("localhost",)


class TransportConfigError(ValueError):
    """The transport cannot start with these settings; the message says what to change."""


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _json_response(
    status: int, error: str, description: str, headers: list[tuple[bytes, bytes]] | None = None
) -> tuple[Message, Message]:
    body = json.dumps({"error": error, "error_description": description}).encode()
    start = {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        + (headers or []),
    }
    return start, {"type": "http.response.body", "body": body}


def bearer_matches(header: bytes, expected: bytes) -> bool:
    """Whether an Authorization header value is `Bearer <expected>` (scheme case-insensitive, constant time)."""
    scheme, _, credentials = header.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        # still compare, so that a wrong scheme takes as long as a wrong token
        hmac.compare_digest(b"", expected)
        return False
    return hmac.compare_digest(credentials.strip(b" "), expected)


class BearerTokenMiddleware:
    """Refuse HTTP requests that do not carry `Authorization: Bearer <token>` (constant-time comparison).

    The scheme is case-insensitive (RFC 7235: `bearer`, `BEARER` are the same scheme); the token is not.
    """

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = token.encode()

    def _authorized(self, header: bytes) -> bool:
        return bearer_matches(header, self._expected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if not self._authorized(headers.get(b"authorization", b"")):
                start, body = _json_response(
                    401,
                    "unauthorized",
                    "send Authorization: Bearer <token> with the token the server was started with "
                    "(LLM_INFRA_MCP_HTTP_TOKEN)",
                    [(b"www-authenticate", b"Bearer")],
                )
                await send(start)
                await send(body)
                return
        await self.app(scope, receive, send)


BODY_TIMEOUT_S = 30.0


class BodyTimeoutMiddleware:
    """Read each request's whole body within `timeout_s` of the request's start, or answer 408 and close.

    uvicorn times out idle connections between requests but not a body that trickles in (a slowloris on the body
    holds a connection, and a task of the server, for as long as the client likes). The body is read here, then
    handed to the app in one piece; the app still sees a disconnect that comes later. A client that goes away
    before its body is complete is not handed on: there is nothing to answer (and the SDK would log a traceback for
    each such request).
    """

    def __init__(self, app: ASGIApp, timeout_s: float = BODY_TIMEOUT_S) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        with anyio.move_on_after(self.timeout_s) as deadline:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    log.debug("HTTP client went away before its request body was complete")
                    return
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
        if deadline.cancelled_caught:
            log.warning("HTTP request body not complete after %.0f s; answering 408", self.timeout_s)
            start, body = _json_response(
                408,
                "request_timeout",
                f"the request body did not arrive within {self.timeout_s:g} s; send it at once",
                [(b"connection", b"close")],
            )
            await send(start)
            await send(body)
            return
        pending: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay() -> Message:
            if pending:
                return pending.pop(0)
            return await receive()

        await self.app(scope, replay, send)


# ---- who is connecting: the user behind a loopback connection ---------------------------------------------------
# TCP carries no credentials (SO_PEERCRED is for unix sockets), but on Linux the kernel lists every TCP socket of
# this network namespace in /proc/net/tcp and /proc/net/tcp6 with the uid that created it. The peer of a loopback
# connection is such a socket: the row whose local address is the peer's address and whose remote address is ours.

PEER_EXTENSION = "llm-infra-mcp.peer"  # scope["extensions"][...]: the connection's Peer, set by the guarded protocol
PROC_NET_TCP = ("/proc/net/tcp", "/proc/net/tcp6")
_TCP_TIME_WAIT = "06"
_FORWARDED = (b"x-forwarded-for", b"forwarded")


class PeerUnknownError(Exception):
    """The user behind a connection could not be determined; the message says why."""


@functools.cache
def peer_uid_supported() -> bool:
    """Whether this system tells which user holds the other end of a loopback connection: tried once, on a
    connection of this process's own (a /proc that lists no owners, as some sandboxes have, does not count)."""
    if not sys.platform.startswith("linux") or not os.access(PROC_NET_TCP[0], os.R_OK):
        return False
    try:
        with socket.create_server(("127.0.0.1", 0)) as listener, socket.create_connection(listener.getsockname()):
            served, address = listener.accept()
            with served:
                return peer_uid(address[:2], served.getsockname()[:2]) == os.geteuid()
    except (OSError, PeerUnknownError):
        return False


def _proc_words(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """An address as /proc/net/tcp{,6} print it: each 32-bit word in the host's byte order, in hex."""
    packed = ip.packed
    return "".join(f"{int.from_bytes(packed[i : i + 4], sys.byteorder):08X}" for i in range(0, len(packed), 4))


def _proc_forms(host: str) -> tuple[str | None, str]:
    """(the address as /proc/net/tcp prints it or None for IPv6, as /proc/net/tcp6 prints it): an IPv4 address
    appears in tcp6 too, IPv4-mapped, when the socket at it is an IPv6 one."""
    ip = ipaddress.ip_address(host.split("%")[0].strip("[]"))
    if isinstance(ip, ipaddress.IPv6Address):
        v4 = ip.ipv4_mapped
        return (_proc_words(v4) if v4 else None), _proc_words(ip)
    return _proc_words(ip), _proc_words(ipaddress.IPv6Address(f"::ffff:{ip}"))


def peer_uid(client: tuple[str, int], server: tuple[str, int], proc_files: tuple[str, str] = PROC_NET_TCP) -> int:
    """The uid that holds the socket at the other end of a TCP connection on this machine: the row of
    /proc/net/tcp{,6} whose local address is `client` (the peer, as this end sees it) and whose remote address is
    `server` (this end). Only a socket a process still holds counts (inode not 0): one whose owner closed it, and
    one in TIME_WAIT, lists uid 0. PeerUnknownError when there is no such row."""
    try:
        peer, ours = _proc_forms(client[0]), _proc_forms(server[0])
    except ValueError:
        raise PeerUnknownError(f"{client[0]!r} is not an IP address") from None
    problems = []
    for index, (peer_form, our_form) in enumerate(zip(peer, ours, strict=True)):
        if peer_form is None or our_form is None:
            continue
        needle = f" {peer_form}:{client[1]:04X} {our_form}:{server[1]:04X} "
        try:
            text = Path(proc_files[index]).read_text()
        except OSError as exc:
            problems.append(f"{proc_files[index]}: {exc.strerror or exc}")
            continue
        at = text.find(needle)
        while at >= 0:
            end = text.find("\n", at)
            fields = text[text.rfind("\n", 0, at) + 1 : end if end >= 0 else len(text)].split()
            if len(fields) > 9 and fields[3] != _TCP_TIME_WAIT and fields[9] != "0" and fields[7].isdigit():
                return int(fields[7])
            at = text.find(needle, at + 1)
    detail = f" ({'; '.join(problems)})" if problems else ""
    raise PeerUnknownError(f"no process on this machine holds the socket at {client[0]}:{client[1]}{detail}")


class Peer:
    """The other end of one connection, as its transport saw it; the user behind it is looked up once."""

    def __init__(self, client: tuple[str, int], server: tuple[str, int]) -> None:
        self.client = client
        self.server = server
        self._uid: int | None = None

    async def uid(self) -> int:
        if self._uid is None:
            self._uid = await anyio.to_thread.run_sync(peer_uid, self.client, self.server)
        return self._uid


class LocalUserMiddleware:
    """On loopback: serve a request that comes from a process of the user that runs the server, or of root (who
    can read that user's token and files anyway), or that carries the bearer token when one is set; answer any
    other with 403 (401 when it sent an Authorization header that is wrong), before the request reaches MCP.

    The peer is the connection's own (PEER_EXTENSION, from the transport, looked up once per connection) under
    serve_http; under another ASGI server, scope["client"], except when the request names a forwarded client (a
    proxy-headers middleware may have rewritten that address from X-Forwarded-For). A peer that cannot be
    determined is refused."""

    def __init__(self, app: ASGIApp, token: str | None = None, *, uids: Iterable[int] | None = None) -> None:
        self.app = app
        self._expected = token.encode() if token else None
        self.uids = frozenset(uids if uids is not None else {os.geteuid(), 0})

    async def _peer_uid(self, scope: Scope, headers: dict[bytes, bytes]) -> int:
        peer = (scope.get("extensions") or {}).get(PEER_EXTENSION)
        if isinstance(peer, Peer):
            return await peer.uid()
        if any(name in headers for name in _FORWARDED):
            raise PeerUnknownError("the request names a forwarded client (X-Forwarded-For or Forwarded)")
        client, server = scope.get("client"), scope.get("server")
        if not client or not server or server[1] is None:
            raise PeerUnknownError("the connection has no TCP address")
        return await anyio.to_thread.run_sync(peer_uid, (client[0], client[1]), (server[0], server[1]))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"authorization")
        if self._expected is not None and given is not None and bearer_matches(given, self._expected):
            await self.app(scope, receive, send)
            return
        try:
            uid: int | None = await self._peer_uid(scope, headers)
            who = f"comes from uid {uid}"
        except PeerUnknownError as exc:
            uid, who = None, f"comes from a user that cannot be determined: {exc}"
        if uid in self.uids:
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})
            return
        served = ", ".join(f"uid {u}" for u in sorted(self.uids, reverse=True))
        if self._expected is None:
            remedy = (
                "connect as that user, or start the server with LLM_INFRA_MCP_HTTP_TOKEN set and send "
                "Authorization: Bearer <token>"
            )
        else:
            remedy = (
                "connect as that user, or send Authorization: Bearer <token> with the server's LLM_INFRA_MCP_HTTP_TOKEN"
            )
        if self._expected is not None and given is not None:
            log.warning("HTTP: refused a request with a wrong bearer token on loopback (it %s)", who)
            status, error, reason = 401, "unauthorized", "the bearer token is wrong"
        else:
            log.warning("HTTP: refused a request on loopback from another user (it %s)", who)
            status, error, reason = 403, "forbidden", "another user's process may not use this server"
        with_token = ", and requests with its bearer token" if self._expected is not None else ""
        start, body = _json_response(
            status,
            error,
            f"{reason}: on loopback this server serves the processes of {served} (the user that runs it, and root)"
            f"{with_token}; this connection {who}. Accepted: {remedy}",
            [(b"www-authenticate", b"Bearer")] if status == 401 else None,
        )
        await send(start)
        await send(body)


def load_or_create_token(path: Path) -> str:
    """The token kept in `path` (only this user may read it), made and stored with mode 0600 when there is none.
    TransportConfigError when the file is another user's or others may read it."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        fd = None
    if fd is None:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise TransportConfigError(
                f"{path} must be a file of this user that only this user may read (chmod 600 {path}), or be removed"
            )
        token = path.read_text(encoding="utf-8").strip()
        if len(token) < 16:
            raise TransportConfigError(f"{path} holds no token (16 characters or more); remove it to make a new one")
        return token
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(token + "\n")
    return token


def http_app(server: MCPServer, host: str, token: str | None, *, body_timeout_s: float = BODY_TIMEOUT_S) -> ASGIApp:
    """The ASGI app for streamable HTTP at /mcp: who may call (first, so that a caller who may not is refused
    before its body is read), then the body timeout. Elsewhere than loopback: the bearer token. On loopback: the
    user that runs the server, or the token (LocalUserMiddleware); where the system cannot tell which user
    connects, the token alone, without which the server does not start."""
    if not is_loopback(host) and not token:
        raise TransportConfigError(
            f"refusing to serve HTTP on {host} without a bearer token: any machine that reaches it could run jobs. "
            "Set LLM_INFRA_MCP_HTTP_TOKEN (or bind 127.0.0.1)"
        )
    security = None
    if is_loopback(host):
        # DNS-rebinding protection: a web page must not reach a local server through a name it controls.
        # Stated here rather than left to the SDK, which turns it on only for three spellings of loopback.
        bound = host if ":" not in host or host.startswith("[") else f"[{host}]"
        names = sorted({bound, "127.0.0.1", "localhost", "[::1]"})
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=[f"{name}:*" for name in names],
            allowed_origins=[f"http://{name}:*" for name in names],
        )
    # Elsewhere clients use names we cannot know in advance; the bearer token is what protects the server.
    app: ASGIApp = BodyTimeoutMiddleware(
        server.streamable_http_app(host=host, transport_security=security), body_timeout_s
    )
    if is_loopback(host) and peer_uid_supported():
        return LocalUserMiddleware(app, token)
    if not token:
        raise TransportConfigError(
            f"refusing to serve HTTP on {host} without a bearer token: this system cannot tell which user connects "
            "to loopback (no /proc/net/tcp), so every local user could run jobs. Set LLM_INFRA_MCP_HTTP_TOKEN"
        )
    return BearerTokenMiddleware(app, token)


# ---- connections: the header timeout, the connection limit, a log that stays small ------------------------------

HEADER_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 512
LOG_INTERVAL_S = 10.0
FD_RESERVE = 256  # descriptors left for everything else: the state database, job logs, a job's pipes


def connection_limit(wanted: int = MAX_CONNECTIONS) -> int:
    """At most `wanted` connections, and few enough that accepting never runs out of file descriptors: each open
    connection, one being closed to make room, and one accepted but not yet seen (up to the listen backlog, which
    serve_http sets to the limit) take one each. RLIMIT_NOFILE's soft limit is raised towards its hard limit
    when it is below what that needs."""
    needed = 3 * wanted + FD_RESERVE
    try:
        import resource  # POSIX only

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < needed:
            target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except ImportError:
        return wanted
    if soft == resource.RLIM_INFINITY:
        return wanted
    return min(wanted, max(8, (soft - FD_RESERVE) // 3))


class RateLimitFilter(logging.Filter):
    """At most `burst` records of one message (logger and format string) per `interval_s`; the first one let
    through after some were left out says how many."""

    def __init__(self, burst: int = 5, interval_s: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.burst = burst
        self.interval_s = interval_s
        self.clock = clock
        self._windows: dict[tuple[str, str], list[float]] = {}  # key -> [window start, let through, left out]

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.msg if isinstance(record.msg, str) else type(record.msg).__name__)
        now = self.clock()
        window = self._windows.get(key)
        if window is None or now - window[0] >= self.interval_s:
            left_out = int(window[2]) if window else 0
            if len(self._windows) > 1000:
                self._windows.clear()
            self._windows[key] = [now, 1, 0]
            if left_out and isinstance(record.msg, str):
                record.msg += f" [{left_out} more like this in the {self.interval_s:g} s before were not logged]"
            return True
        if window[1] < self.burst:
            window[1] += 1
            return True
        window[2] += 1
        return False


RATE_LIMITED_LOGGERS = ("asyncio", "uvicorn.error", "mcp.server.streamable_http", __name__)


def limit_log_rate(names: Iterable[str] = RATE_LIMITED_LOGGERS) -> None:
    """Rate-limit the loggers that write a line per connection or request when flooded (asyncio's accept errors,
    uvicorn's invalid requests, the SDK's failed requests, this module's refusals)."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RateLimitFilter) for f in logger.filters):
            logger.addFilter(RateLimitFilter())


def _raw_response(status: int, error: str, description: str) -> bytes:
    """A whole HTTP/1.1 response that closes the connection, for a connection no request cycle has started on."""
    body = json.dumps({"error": error, "error_description": description}).encode()
    head = (
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class ConnectionGuard:
    """What the connections of one HTTP server share: the connection limit, the header timeout, and counts of the
    connections closed for either, logged as one summary line per `log_interval_s` rather than one per connection.

    `waiting` holds the open connections that wait for a request's headers (a new one, or an idle keep-alive one),
    longest first: at the limit a new connection closes the first of them; when none waits (every connection is
    in a request), the new one is answered 503 and closed."""

    def __init__(
        self,
        max_connections: int = MAX_CONNECTIONS,
        header_timeout_s: float = HEADER_TIMEOUT_S,
        log_interval_s: float = LOG_INTERVAL_S,
    ) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.log_interval_s = log_interval_s
        self.open: set[Any] = set()
        self.waiting: dict[Any, None] = {}
        self.totals: Counter[str] = Counter()  # since the start: timed_out, evicted, refused
        self._pending: Counter[str] = Counter()
        self._flush: asyncio.TimerHandle | None = None
        self._last_flush = -LOG_INTERVAL_S * 1e6

    def admit(self, connection: Any) -> bool:
        """Count a new connection in; False when it must be refused (the limit, and no connection to close)."""
        if len(self.open) >= self.max_connections:
            victim = next(iter(self.waiting), None)
            if victim is None:
                self.note("refused")
                return False
            self.release(victim)
            victim.close_waiting()
            self.note("evicted")
        self.open.add(connection)
        return True

    def release(self, connection: Any) -> None:
        self.open.discard(connection)
        self.waiting.pop(connection, None)

    def note(self, what: str) -> None:
        self.totals[what] += 1
        self._pending[what] += 1
        if self._flush is None:  # a burst is gathered for a second, then one line at most per interval
            delay = max(min(1.0, self.log_interval_s), self._last_flush + self.log_interval_s - time.monotonic())
            self._flush = asyncio.get_running_loop().call_later(delay, self.flush)

    def flush(self) -> None:
        """Log what was counted since the last line (serve_http calls it once more when the server stops)."""
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        self._last_flush = time.monotonic()
        counts, self._pending = self._pending, Counter()
        parts = []
        if counts["timed_out"]:
            parts.append(
                f"closed {counts['timed_out']} connection(s) that sent no complete request headers within "
                f"{self.header_timeout_s:g} s"
            )
        if counts["evicted"]:
            parts.append(f"closed {counts['evicted']} connection(s) waiting for headers to make room for new ones")
        if counts["refused"]:
            parts.append(f"refused {counts['refused']} connection(s) while every connection was in a request")
        if parts:
            log.warning(
                "HTTP: %s (limit %d connections; at most one such line per %g s)",
                "; ".join(parts),
                self.max_connections,
                self.log_interval_s,
            )


def guarded_protocol(guard: ConnectionGuard) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with `guard`'s limits, and each connection's Peer in its requests' scope."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._header_timer: asyncio.TimerHandle | None = None
            self._partial = False  # bytes of the awaited request arrived
            self._served = False  # a request was answered on this connection
            self.peer: Peer | None = None
            inner = self.app

            async def app(scope: Any, receive: Any, send: Any) -> None:
                if self.peer is not None:
                    scope["extensions"] = {**(scope.get("extensions") or {}), PEER_EXTENSION: self.peer}
                await inner(scope, receive, send)

            self.app = app

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if self.client and self.server and self.server[1] is not None:
                self.peer = Peer(self.client, (self.server[0], self.server[1]))
            if not guard.admit(self):
                transport.write(
                    _raw_response(
                        503,
                        "server_busy",
                        f"the server holds {guard.max_connections} connections, its most, each in a request; "
                        "try again shortly",
                    )
                )
                transport.close()
                return
            self._sync_waiting()

        def data_received(self, data: bytes) -> None:
            if self._header_timer is not None:
                self._partial = True
            super().data_received(data)
            self._sync_waiting()

        def on_response_complete(self) -> None:
            self._served = True
            super().on_response_complete()
            self._sync_waiting()

        def connection_lost(self, exc: Exception | None) -> None:
            super().connection_lost(exc)
            self._stop_timer()
            guard.release(self)

        def _stop_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            guard.waiting.pop(self, None)

        def _sync_waiting(self) -> None:
            """Start the header clock when the connection starts waiting for a request's headers; stop it when
            they are complete."""
            waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
            if waiting and self._header_timer is None and self in guard.open:
                self._partial = False
                self._header_timer = self.loop.call_later(guard.header_timeout_s, self._headers_late)
                guard.waiting[self] = None
            elif not waiting and self._header_timer is not None:
                self._stop_timer()

        def _headers_late(self) -> None:
            self._header_timer = None
            guard.waiting.pop(self, None)
            if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
                return
            if self._partial:
                self.transport.write(
                    _raw_response(
                        408,
                        "request_timeout",
                        f"the request headers did not arrive within {guard.header_timeout_s:g} s; send them at once",
                    )
                )
            self.transport.close()
            if self._partial or not self._served:  # an idle keep-alive connection closing is no news
                guard.note("timed_out")

        def close_waiting(self) -> None:
            """Close this connection, which waits for a request's headers, to make room for a new one."""
            self._stop_timer()
            if not self.transport.is_closing():
                self.transport.close()

    return GuardedH11Protocol


def serve_http(
    server: MCPServer,
    host: str,
    port: int,
    token: str | None,
    *,
    body_timeout_s: float = BODY_TIMEOUT_S,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
    token_file: Path | None = None,
) -> None:
    """Serve `server` over streamable HTTP with uvicorn (see the module's docstring). `token_file`: where a token
    is kept when the server binds loopback without one on a system that cannot tell which user connects."""
    import uvicorn

    if is_loopback(host) and not token and not peer_uid_supported() and token_file is not None:
        token = load_or_create_token(token_file)
        log.warning(
            "no LLM_INFRA_MCP_HTTP_TOKEN is set and this system cannot tell which user connects to loopback: "
            "clients must send Authorization: Bearer <token>, with the token kept in %s (mode 0600)",
            token_file,
        )
    app = http_app(server, host, token, body_timeout_s=body_timeout_s)
    limit = connection_limit(max_connections)
    guard = ConnectionGuard(limit, header_timeout_s)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        http=guarded_protocol(guard),
        ws="none",
        proxy_headers=False,  # the client address decides who may call on loopback: no header may rewrite it
        backlog=min(2048, limit),
    )
    limit_log_rate()
    log.info(
        "serving %s over streamable HTTP at http://%s:%d/mcp (at most %d connections, %g s for a request's headers)",
        server.name,
        host,
        port,
        limit,
        header_timeout_s,
    )

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            try:
                await super().shutdown(sockets=sockets)
            finally:  # uvicorn ends a process stopped by a signal by raising the signal again: log the last counts now
                guard.flush()

    Server(config).run()


# ---- stdio ---------------------------------------------------------------------------------------------------------
# The SDK's stdio transport (mcp.server.stdio.stdio_server) parses each line with
# mcp_types.jsonrpc_message_adapter; a line that fails becomes an Exception on the read stream, which the dispatcher
# logs at debug level and drops: the client gets no answer and waits for its own timeout. That covers invalid JSON,
# JSON the parser refuses (a lone surrogate escape, an integer over 4300 digits, nesting over 200 levels), a batch
# (an array), and any object that is no JSON-RPC message. A request with `"id": null` (or true, or 1.5) passes as a
# notification, since the notification model ignores the extra key, and is never answered either.
# StdinGuard sits on the wire before the SDK's reader: it checks each line as the SDK will, passes the good ones on
# unchanged, and answers the others itself, through the SDK's own write stream, with a JSON-RPC error that carries
# the request's id where one can be read (-32700 for what does not parse, -32600 for what is no valid request).
# Malformed responses (objects with result or error and no method) are never answered, as JSON-RPC requires.

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
_SCALAR_END = re.compile(r"[^,}\]\s]*")


class _UnownedText(io.TextIOWrapper):
    """A text layer whose close leaves the binary stream under it open (it is not ours to close)."""

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            self.detach()


def _request_id(value: Any) -> int | str | None:
    """`value` if it can be a JSON-RPC request id here (a string or an integer), else None."""
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    return None


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _skip_value(text: str, i: int) -> int:
    """The index just past the JSON value at `i`, without parsing it (no recursion, no number conversion)."""
    if text[i] == '"':
        return json.decoder.scanstring(text, i + 1)[1]
    if text[i] in "[{":
        depth = 0
        while i < len(text):
            char = text[i]
            if char == '"':
                i = json.decoder.scanstring(text, i + 1)[1]
                continue
            if char in "[{":
                depth += 1
            elif char in "]}":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        raise ValueError("unterminated")
    match = _SCALAR_END.match(text, i)
    return match.end() if match else i


def scan_top_level(text: str) -> tuple[set[str], int | str | None]:
    """The top-level keys of a JSON object that may not parse as a whole, and its request id if readable.

    Reads keys and skips values left to right until the text stops making sense; a deep or broken value after
    the id does not hide the id.
    """
    keys: set[str] = set()
    found: int | str | None = None
    try:
        i = _skip_ws(text, 0)
        if i >= len(text) or text[i] != "{":
            return keys, None
        i += 1
        while True:
            i = _skip_ws(text, i)
            if i >= len(text) or text[i] != '"':
                break
            key, i = json.decoder.scanstring(text, i + 1)
            i = _skip_ws(text, i)
            if i >= len(text) or text[i] != ":":
                break
            i = _skip_ws(text, i + 1)
            if i >= len(text):
                break
            keys.add(key)
            end = _skip_value(text, i)
            if key == "id":
                with contextlib.suppress(ValueError):
                    found = _request_id(json.loads(text[i:end]))
            i = _skip_ws(text, end)
            if i >= len(text) or text[i] != ",":
                break
            i += 1
    except (ValueError, IndexError):
        pass
    return keys, found


def _error(request_id: int | str | None, code: int, message: str) -> JSONRPCError:
    return JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=code, message=message))


def _is_response(keys: Iterable[str]) -> bool:
    keys = set(keys)
    return "method" not in keys and bool({"result", "error"} & keys)


def _invalid_request_reason(exc: ValidationError) -> str:
    """What is wrong with an object that is no valid request, from the SDK's errors for its request model."""
    reasons = []
    for error in exc.errors():
        loc = error.get("loc", ())
        if loc and loc[0] == "JSONRPCRequest":
            where = ".".join(str(part) for part in loc[1:]) or "message"
            reasons.append(f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(reasons[:5]) or "not a JSON-RPC 2.0 request"


def check_line(line: str) -> list[JSONRPCError] | None:
    """None if the SDK's reader will take `line` as a valid message; else the errors to answer instead of passing
    it on (an empty list: drop it without an answer, for blank lines and malformed responses)."""
    if not line.strip():
        return []
    try:
        message = jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValidationError as exc:
        invalid_json = [e for e in exc.errors() if e.get("type") == "json_invalid"]
        if invalid_json:
            keys, request_id = scan_top_level(line)
            if _is_response(keys):
                return []
            reason = str(invalid_json[0].get("msg", "invalid JSON"))
            if "hex escape" in reason or "surrogate" in reason:
                reason += " (a lone UTF-16 surrogate is no character: strings must be valid Unicode)"
            return [_error(request_id, PARSE_ERROR, f"Parse error: {reason}")]
        parsed = pydantic_core.from_json(line)
        if isinstance(parsed, list):
            ids = [
                _request_id(item.get("id"))
                for item in parsed
                if isinstance(item, dict) and "method" in item and _request_id(item.get("id")) is not None
            ]
            reason = (
                "Invalid Request: JSON-RPC batches (arrays) are not supported (MCP removed them in 2025-06-18); "
                "send each message on its own line"
            )
            return [_error(i, INVALID_REQUEST, reason) for i in ids] or [_error(None, INVALID_REQUEST, reason)]
        if isinstance(parsed, dict):
            if _is_response(parsed):
                return []
            request_id = _request_id(parsed.get("id"))
            return [_error(request_id, INVALID_REQUEST, f"Invalid Request: {_invalid_request_reason(exc)}")]
        return [_error(None, INVALID_REQUEST, "Invalid Request: a JSON-RPC message is a JSON object")]
    if isinstance(message, JSONRPCNotification) and "id" in pydantic_core.from_json(line):
        # A request whose id the SDK cannot take (null, a boolean, a fraction) would pass as a notification.
        return [_error(None, INVALID_REQUEST, "Invalid Request: id must be a string or an integer (null is not an id)")]
    return None


class StdinGuard:
    """The wire's stdin as the SDK's stdio reader iterates it, with the lines it would drop answered here."""

    def __init__(self, buffer: BinaryIO) -> None:
        self._file = anyio.wrap_file(_UnownedText(buffer, encoding="utf-8", errors="replace"))
        self._write: Any = None
        self._attached = anyio.Event()
        self.answered = 0

    def attach(self, write_stream: Any) -> None:
        """The SDK's write stream, on which the answers go out (ordered with the server's own messages)."""
        self._write = write_stream
        self._attached.set()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        async for line in self._file:
            replies = check_line(line)
            if replies is None:
                yield line
                continue
            for reply in replies:
                log.warning("answered a malformed message (id %r): %s", reply.id, reply.error.message[:200])
                await self._attached.wait()
                try:
                    await self._write.send(SessionMessage(reply))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return
                self.answered += 1


@contextlib.contextmanager
def _claimed_stdin() -> Iterator[BinaryIO]:
    """The wire's stdin on a private descriptor, with fd 0 on /dev/null meanwhile (as the SDK does for the streams
    it opens itself), so that a child or a stray read sees end of file instead of eating protocol lines."""
    try:
        import fcntl  # POSIX only

        if sys.stdin is None or sys.stdin.buffer.fileno() != 0:
            raise OSError("stdin is not fd 0")
        private = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    except (ImportError, OSError, ValueError, AttributeError):
        yield sys.stdin.buffer  # no descriptor to divert: serve the stream in place
        return
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(devnull, 0)
    finally:
        os.close(devnull)
    try:
        # closefd=False: the reader thread may still block on it after we return; it must not be recycled.
        yield os.fdopen(private, "rb", closefd=False)
    finally:
        with contextlib.suppress(OSError):
            os.dup2(private, 0)


async def serve_stdio_async(server: MCPServer) -> None:
    """Serve `server` over stdio like MCPServer.run_stdio_async, with StdinGuard on the wire."""
    # MCPServer exposes no public way to run its low-level server on streams of our own.
    lowlevel = sdk.lowlevel_server(server)
    if lowlevel is None:
        log.warning("this mcp SDK's MCPServer has no low-level server (core/sdk.py); serving stdio unguarded")
        await server.run_stdio_async()
        return
    with _claimed_stdin() as buffer:
        guard = StdinGuard(buffer)
        async with stdio_server(stdin=guard) as (read_stream, write_stream):  # type: ignore[arg-type]
            guard.attach(write_stream)
            await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())


def serve_stdio(server: MCPServer) -> None:
    anyio.run(serve_stdio_async, server)
