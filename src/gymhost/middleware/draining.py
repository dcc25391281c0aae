"""No new episodes while the process drains: a seed (or a Gymnasium-style reset) answers 503 with ``Retry-After``
and ``failure_kind: provider_unavailable``, so a load balancer or client takes the episode elsewhere; open episodes go
on. The drain itself is ``_process._drain``'s."""

from __future__ import annotations

from collections.abc import Collection

from starlette.types import ASGIApp, Receive, Scope, Send

from .._asgi import answer_json, path_below_mount
from .._process._drain import REFUSAL, drain

__all__ = ["DrainingMiddleware"]


class DrainingMiddleware:
    def __init__(self, app: ASGIApp, *, starts: Collection[str]) -> None:
        self.app = app
        self.starts = frozenset(starts)  # the POST paths that start an episode

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        http = scope["type"] == "http" and scope["method"] == "POST"
        if drain.draining and http and path_below_mount(scope) in self.starts:
            await answer_json(scope, receive, send, 503, REFUSAL, {"Retry-After": "5"})
            return
        await self.app(scope, receive, send)
