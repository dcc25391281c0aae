"""A bearer token in front of a server, for when it listens beyond loopback.

A Gym server trusts whoever reaches it: seeding, tool calls and verify change state, and the pool and instance
routes show it. ``BearerTokenMiddleware`` refuses every request without ``Authorization: Bearer <token>`` with a
401, except liveness probes (``GET`` or ``HEAD`` of ``open_paths``), which a load balancer sends without
credentials. The token is compared in constant time, and it is never logged or echoed.

The token comes from ``GYMHOST_TOKEN`` unless given explicitly, so an operator who sets it protects every app gymhost
builds in the process, ``create_app`` inside a gateway of their own included. Turning the check off is explicit:
``token=NO_TOKEN``.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Collection

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from .._config import TOKEN_ENV_VAR, NoToken
from .._exceptions import ServeError

__all__ = ["LIVENESS_PATHS", "BearerTokenMiddleware", "resolve_token"]

# Gym's liveness routes (nemo-gym 0.4.0 answers "/" only; 0.5+ adds the others).
LIVENESS_PATHS = frozenset({"/", "/health", "/healthz", "/livez", "/readyz"})


def resolve_token(token: str | NoToken | None) -> str | None:
    """The token every request must carry, or None for no check.

    ``None`` reads ``GYMHOST_TOKEN`` (unset or empty: no check); ``NO_TOKEN`` turns the check off; a string is the
    token. A header carries ASCII only, so a token that is not ASCII could never be sent: it is refused here, at
    build time (without echoing it), and so is an empty string, which would say neither "off" nor a token.
    """
    if isinstance(token, NoToken):
        return None
    if token == "":
        raise ServeError("the bearer token is empty; pass NO_TOKEN to turn the check off")
    resolved = token if token is not None else (os.environ.get(TOKEN_ENV_VAR) or None)
    if resolved is not None and not (resolved.isascii() and resolved.isprintable() and " " not in resolved):
        raise ServeError("the bearer token must be printable ASCII without spaces (it travels in an HTTP header)")
    return resolved


class BearerTokenMiddleware:
    def __init__(self, app: ASGIApp, *, token: str, open_paths: Collection[str] = LIVENESS_PATHS) -> None:
        if not token:
            raise ValueError("BearerTokenMiddleware needs a non-empty token")
        self.app = app
        self.expected = token.encode("ascii")
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self._is_open(scope):
            await self.app(scope, receive, send)
            return
        given = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
        scheme, _, credentials = given.partition(b" ")
        # The scheme is case-insensitive (RFC 7235); the token is compared in constant time.
        if scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), self.expected):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        reason = "a wrong bearer token" if given else "no bearer token"
        detail = f"this server needs Authorization: Bearer <token>; the request had {reason}"
        await JSONResponse({"detail": detail}, status_code=401, headers={"WWW-Authenticate": "Bearer"})(
            scope, receive, send
        )

    def _is_open(self, scope: Scope) -> bool:
        if scope.get("method") not in ("GET", "HEAD"):
            return False
        path: str = scope["path"]
        root = scope.get("root_path") or ""
        # Mounted: Starlette keeps the prefix in path and sets root_path. A root_path the path does not carry (set
        # by the server, for a proxy's prefix) is left alone, as Starlette's routing does.
        if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):
            path = path[len(root) :] or "/"
        return path in self.open_paths
