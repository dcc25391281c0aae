"""A bearer token in front of a server, for when it listens beyond loopback.

A Gym server trusts whoever reaches it: seeding, tool calls and verify change state, and the pool and instance
routes show it. ``BearerTokenMiddleware`` refuses every request without ``Authorization: Bearer <token>`` with a
401, except probes (``GET`` or ``HEAD`` of ``open_paths``: liveness and readiness), which a load balancer sends
without credentials. The token is compared in constant time, and it is never logged or echoed.

The token comes from ``GYMHOST_TOKEN`` unless given explicitly, so an operator who sets it protects every app gymhost
builds in the process, ``create_app`` inside a gateway of their own included. Turning the check off is explicit:
``token=NO_TOKEN``.
"""

from __future__ import annotations

import hmac
from collections.abc import Collection

from starlette.types import ASGIApp, Receive, Scope, Send

from .._asgi import answer_json, path_below_mount
from .._nemo_gym import LIVENESS_ROUTES, READINESS_ROUTE

__all__ = ["GATEWAY_LIVENESS_PATHS", "LIVENESS_PATHS", "BearerTokenMiddleware"]

# What a probe reaches without the token on an app: its liveness routes and its readiness, which a load balancer
# sends without credentials. (The name is older than the two were told apart: it holds readiness too.)
LIVENESS_PATHS = frozenset({*LIVENESS_ROUTES, READINESS_ROUTE})
# A gateway's liveness: an app's but "/", which lists its servers. One probe path (/livez) serves any target.
GATEWAY_LIVENESS_PATHS = frozenset(LIVENESS_ROUTES) - {"/"}


class BearerTokenMiddleware:
    """``mounts``: prefixes of apps below that check the token themselves (a gateway's in-process mounts), whose
    requests pass on unchecked here."""

    def __init__(
        self, app: ASGIApp, *, token: str, open_paths: Collection[str] = LIVENESS_PATHS, mounts: Collection[str] = ()
    ) -> None:
        if not token:
            raise ValueError("BearerTokenMiddleware needs a non-empty token")
        self.app = app
        self.expected = token.encode("ascii")
        self.open_paths = frozenset(open_paths)
        self.mounts = tuple(mounts)

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
        await answer_json(scope, receive, send, 401, {"detail": detail}, {"WWW-Authenticate": "Bearer"})

    def _is_open(self, scope: Scope) -> bool:
        path = path_below_mount(scope)
        if any(path == mount or path.startswith(mount + "/") for mount in self.mounts):
            return True
        return scope.get("method") in ("GET", "HEAD") and path in self.open_paths
