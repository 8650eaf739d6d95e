"""Serving a server over stdio or streamable HTTP.

HTTP binds 127.0.0.1 by default, where the SDK's DNS-rebinding protection (Host and Origin checks) is on.
On any other address a bearer token is required: without one the server refuses to start.
"""

import hmac
import ipaddress
import json
import logging

from mcp.server import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Receive, Scope, Send

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


class BearerTokenMiddleware:
    """Refuse HTTP requests that do not carry `Authorization: Bearer <token>` (constant-time comparison)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                body = json.dumps(
                    {
                        "error": "unauthorized",
                        "error_description": "send Authorization: Bearer <token> "
                        "with the token the server was started with (LLM_INFRA_MCP_HTTP_TOKEN)",
                    }
                ).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def http_app(server: MCPServer, host: str, token: str | None) -> ASGIApp:
    """The ASGI app for streamable HTTP at /mcp, with the token check when a token is set."""
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
    app: ASGIApp = server.streamable_http_app(host=host, transport_security=security)
    return BearerTokenMiddleware(app, token) if token else app


def serve_http(server: MCPServer, host: str, port: int, token: str | None) -> None:
    import uvicorn

    app = http_app(server, host, token)
    log.info("serving %s over streamable HTTP at http://%s:%d/mcp", server.name, host, port)
    uvicorn.run(app, host=host, port=port, log_level="warning")
