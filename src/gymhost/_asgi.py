"""Small pure-ASGI helpers the middleware and the forwarding share: a request's body read whole and replayed, the
path below a mount, and a JSON answer."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

__all__ = ["answer_json", "path_below_mount", "read_body", "replay", "replay_first"]


async def read_body(receive: Receive) -> bytes:
    """The whole request body (nothing, when the client left first)."""
    chunks = []
    while True:
        message: Any = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def replay(body: bytes) -> Receive:
    """A ``receive`` that gives ``body`` whole, then a disconnect: for a layer below, once the body was read."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def replay_first(first: Message, receive: Receive) -> Receive:
    """``first``, then whatever the server sends next (the disconnect an app may wait for)."""
    pending: Message | None = first

    async def replayed() -> Message:
        nonlocal pending
        if pending is None:
            return await receive()
        message, pending = pending, None
        return message

    return replayed


def path_below_mount(scope: Scope) -> str:
    """The path an app routes on. Mounted, Starlette keeps the prefix in ``path`` and sets ``root_path``; a
    ``root_path`` the path does not carry (a proxy's prefix, set by the server) is left alone, as Starlette's routing
    does, and so is a path that only starts with the prefix's letters (``/gridsim2`` under ``/gridsim``)."""
    path: str = scope["path"]
    root: str = scope.get("root_path") or ""
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):
        return path[len(root) :] or "/"
    return path


async def answer_json(
    scope: Scope, receive: Receive, send: Send, status: int, body: Any, headers: dict[str, str] | None = None
) -> None:
    """Answer the request here, with ``body`` as JSON."""
    await JSONResponse(body, status_code=status, headers=headers)(scope, receive, send)
