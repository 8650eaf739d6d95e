"""Serving a server over stdio or streamable HTTP.

HTTP binds 127.0.0.1 by default, where the SDK's DNS-rebinding protection (Host and Origin checks) is on.
On any other address a bearer token is required: without one the server refuses to start. A request body must
arrive within BODY_TIMEOUT_S.

Over stdio every line gets an answer: the lines the SDK would drop without one are answered here (StdinGuard).
"""

import contextlib
import hmac
import io
import ipaddress
import json
import logging
import os
import re
import sys
from collections.abc import AsyncIterator, Iterable, Iterator
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


class BearerTokenMiddleware:
    """Refuse HTTP requests that do not carry `Authorization: Bearer <token>` (constant-time comparison).

    The scheme is case-insensitive (RFC 7235: `bearer`, `BEARER` are the same scheme); the token is not.
    """

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = token.encode()

    def _authorized(self, header: bytes) -> bool:
        scheme, _, credentials = header.strip().partition(b" ")
        if scheme.lower() != b"bearer":
            # still compare, so that a wrong scheme takes as long as a wrong token
            hmac.compare_digest(b"", self._expected)
            return False
        return hmac.compare_digest(credentials.strip(b" "), self._expected)

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
    handed to the app in one piece; the app still sees a disconnect that comes later.
    """

    def __init__(self, app: ASGIApp, timeout_s: float = BODY_TIMEOUT_S) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        first: Message | None = None
        with anyio.move_on_after(self.timeout_s) as deadline:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    first = message  # the client went away: let the app see it
                    break
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
        pending: list[Message] = (
            [first] if first is not None else [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
        )

        async def replay() -> Message:
            if pending:
                return pending.pop(0)
            return await receive()

        await self.app(scope, replay, send)


def http_app(server: MCPServer, host: str, token: str | None, *, body_timeout_s: float = BODY_TIMEOUT_S) -> ASGIApp:
    """The ASGI app for streamable HTTP at /mcp: the token check when a token is set (first, so that a caller
    without the token is refused before its body is read), then the body timeout."""
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
    return BearerTokenMiddleware(app, token) if token else app


def serve_http(
    server: MCPServer, host: str, port: int, token: str | None, *, body_timeout_s: float = BODY_TIMEOUT_S
) -> None:
    import uvicorn

    app = http_app(server, host, token, body_timeout_s=body_timeout_s)
    log.info("serving %s over streamable HTTP at http://%s:%d/mcp", server.name, host, port)
    uvicorn.run(app, host=host, port=port, log_level="warning")


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
    lowlevel = getattr(server, "_lowlevel_server", None)
    if lowlevel is None:
        log.warning("this mcp SDK has no MCPServer._lowlevel_server; serving stdio without the malformed-line guard")
        await server.run_stdio_async()
        return
    with _claimed_stdin() as buffer:
        guard = StdinGuard(buffer)
        async with stdio_server(stdin=guard) as (read_stream, write_stream):  # type: ignore[arg-type]
            guard.attach(write_stream)
            await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())


def serve_stdio(server: MCPServer) -> None:
    anyio.run(serve_stdio_async, server)
