"""What ``create_app`` changes in the app Gym builds: middlewares swapped for ones that do the same job correctly
under a mount, without forgeable sessions, and without ``BaseHTTPMiddleware``'s cost per request. The routes and
the server class are untouched.

- Sessions: Gym's ``SessionMiddleware`` (public secret, ``path=/``) and its ``add_session_id`` function middleware
  become gymhost's ``SessionMiddleware`` (see ``_sessions``).
- Errors: Gym's ``exception_handling_middleware`` function middleware becomes the pure-ASGI
  ``ExceptionMiddleware``, with the same answers (see ``_exception_middleware``).
- Disconnects (nemo-gym 0.5+): ``ClientDisconnectCancellationMiddleware`` becomes the plain-asyncio
  ``DisconnectCancellationMiddleware``, same behaviour at a fraction of the cost (see ``_disconnect``).
- MCP session tokens: Gym signs them with the same public string; they are signed with a key derived from the
  process secret and that string instead, so a token of one server is no token at another (0.4.0's
  ``MCPResourcesServer._mcp_token_serializer``; 0.5+'s auto-exposure reads the key once, at install).
- Rollout paths (nemo-gym 0.5+): ``RolloutContextMiddleware`` matches ``/ng-rollout/<id>/...`` against the full
  path, which under a mount still starts with the prefix; the replacement matches below the mount.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.middleware.sessions import SessionMiddleware as StarletteSessionMiddleware

from ._disconnect import DisconnectCancellationMiddleware
from ._exception_middleware import ExceptionMiddleware
from ._sessions import SessionMiddleware, server_secret

__all__ = [
    "install_disconnect_cancellation",
    "install_exception_middleware",
    "install_sessions",
    "mount_safe_rollout_paths",
    "secret_mcp_tokens",
    "signing_mcp_tokens_with_secret",
]


def install_sessions(app: Any, cookie_name: str) -> bool:
    """Replace Gym's two session middlewares with gymhost's; False when the app has none to replace."""
    stack: list[Middleware] = app.user_middleware
    position = next((i for i, m in enumerate(stack) if _is(m, StarletteSessionMiddleware)), None)
    if position is None:
        return False
    stack[position] = Middleware(SessionMiddleware, cookie_name=cookie_name)
    stack[:] = [m for m in stack if not _is_add_session_id(m)]
    return True


def install_exception_middleware(app: Any, server_key: str) -> bool:
    """Replace Gym's ``exception_handling_middleware`` with the pure-ASGI one; False when there is none."""
    stack: list[Middleware] = app.user_middleware
    for index, middleware in enumerate(stack):
        if _is_function_middleware(middleware, "exception_handling_middleware"):
            stack[index] = Middleware(ExceptionMiddleware, server_key=server_key)
            return True
    return False


def install_disconnect_cancellation(app: Any) -> bool:
    """Replace nemo-gym's ``ClientDisconnectCancellationMiddleware``; False when the app has none (0.4.0)."""
    stack: list[Middleware] = app.user_middleware
    for index, middleware in enumerate(stack):
        factory: object = middleware.cls
        if getattr(factory, "__name__", "") == "ClientDisconnectCancellationMiddleware":
            stack[index] = Middleware(DisconnectCancellationMiddleware)
            return True
    return False


def _is_add_session_id(middleware: Middleware) -> bool:
    return _is_function_middleware(middleware, "add_session_id")


def _is_function_middleware(middleware: Middleware, name: str) -> bool:
    dispatch = middleware.kwargs.get("dispatch")
    return _is(middleware, BaseHTTPMiddleware) and getattr(dispatch, "__name__", "") == name


def _is(middleware: Middleware, cls: type[Any]) -> bool:
    factory: object = middleware.cls  # typed as a factory; for these entries it is the class itself
    return factory is cls


def secret_mcp_tokens(server: Any) -> None:
    """nemo-gym 0.4.0: sign the class-based MCP server's session tokens with the process secret."""
    if not hasattr(server, "_mcp_token_serializer"):
        return
    from itsdangerous import URLSafeSerializer
    from nemo_gym import base_resources_server

    salt = getattr(base_resources_server, "_MCP_TOKEN_SALT", "nemo-gym-mcp-session-token")
    serializer = URLSafeSerializer(server_secret(server.get_session_middleware_key()), salt=salt)
    object.__setattr__(server, "_mcp_token_serializer", lambda: serializer)


@contextlib.contextmanager
def signing_mcp_tokens_with_secret(server: Any) -> Iterator[None]:
    """nemo-gym 0.5+: auto-exposure builds its token serializer from ``get_session_middleware_key()`` when it is
    installed; for that moment the key is this server's secret. Everything else keeps reading the public name."""
    secret = server_secret(server.get_session_middleware_key())
    key: Callable[[], str] = lambda: secret  # noqa: E731
    object.__setattr__(server, "get_session_middleware_key", key)
    try:
        yield
    finally:
        del server.__dict__["get_session_middleware_key"]


def mount_safe_rollout_paths(app: Any) -> None:
    """nemo-gym 0.5+: match ``/ng-rollout/<id>/...`` below the mount prefix, not against the full path."""
    try:
        from nemo_gym.rollout_correlation import RolloutContextMiddleware, rollout_context
    except ImportError:  # nemo-gym 0.4.0 has no rollout paths
        return

    class MountedRolloutContextMiddleware(RolloutContextMiddleware):  # type: ignore[misc]
        async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
            mount = scope.get("root_path") or ""
            path = scope.get("path", "")
            if scope.get("type") != "http" or not mount or not path.startswith(mount):
                await super().__call__(scope, receive, send)
                return
            match = self._PREFIX.match(path[len(mount) :])
            if match is None:
                await self._app(scope, receive, send)
                return
            rewritten = mount + match.group("rest")
            with rollout_context(match.group("rollout_id")):
                await self._app({**scope, "path": rewritten, "raw_path": rewritten.encode()}, receive, send)

    stack: list[Middleware] = app.user_middleware
    for index, middleware in enumerate(stack):
        if _is(middleware, RolloutContextMiddleware):
            stack[index] = Middleware(MountedRolloutContextMiddleware, *middleware.args, **middleware.kwargs)
