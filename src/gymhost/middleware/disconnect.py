"""Cancel a request's handler when its client disconnects: nemo-gym 0.5+'s ``ClientDisconnectCancellationMiddleware``,
made cheap enough for tool calls.

Gym's middleware is right to exist: a trainer that gives up on a slow verify should not leave the server judging
for nobody. But it runs every request in an anyio task group with a cancel scope and a second task, which was the
largest single cost of a tool call in gymhost's profile, and even a plain asyncio listener task per request cost
more than the rest of gymhost's middleware together.

Most requests are over in milliseconds, long before a client would give up, so the listener is only started for
the ones that are not: a request still running after ``watch_after`` seconds (default 0.1) gets a listener that
becomes the only reader of the ASGI ``receive`` channel, forwards what it reads to the handler, and cancels the
handler if the client disconnects before the response is complete. Until then the handler reads ``receive``
itself, exactly as without the middleware (the listener waits while the handler is reading, so the two never
read at once). Nothing is sent after a disconnect.

The handler runs in an anyio cancel scope (a few microseconds, no task group), and a disconnect cancels that scope,
as Gym's middleware does: shielded cleanup inside the handler is respected, and the cancellation ends at the
scope instead of lingering on the server's task.
"""

from __future__ import annotations

import asyncio
import logging

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["DisconnectCancellationMiddleware"]

logger = logging.getLogger("gymhost")


class DisconnectCancellationMiddleware:
    def __init__(self, app: ASGIApp, *, watch_after: float = 0.1) -> None:
        self.app = app
        self.watch_after = watch_after

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with anyio.CancelScope() as cancel_scope:
            watch = _Watch(self, cancel_scope, receive, send)
            try:
                await self.app(scope, watch.receive, watch.send)
            finally:
                watch.stop()
        if watch.disconnected:
            client = scope.get("client") or ("-", "-")
            logger.info('%s:%s - "%s %s" 499 client disconnected', *client, scope.get("method"), scope.get("path"))


class _Watch:
    """One request: ``receive`` is the handler's until a listener takes it over, which only a slow request gets."""

    __slots__ = (
        "cancel_scope", "complete", "disconnected", "downstream", "forwarded", "listener", "middleware", "reading",
        "timer", "upstream",
    )  # fmt: skip

    def __init__(
        self,
        middleware: DisconnectCancellationMiddleware,
        cancel_scope: anyio.CancelScope,
        receive: Receive,
        send: Send,
    ) -> None:
        self.middleware = middleware
        self.cancel_scope = cancel_scope
        self.upstream = receive
        self.downstream = send
        self.reading = 0
        self.complete = False
        self.disconnected = False
        self.listener: asyncio.Task[None] | None = None
        self.forwarded: asyncio.Queue[Message] | None = None
        self.timer = asyncio.get_running_loop().call_later(middleware.watch_after, self._listen)

    async def receive(self) -> Message:
        if self.forwarded is not None:
            return await self.forwarded.get()
        self.reading += 1
        try:
            return await self.upstream()
        finally:
            self.reading -= 1

    async def send(self, message: Message) -> None:
        if self.disconnected:
            return
        await self.downstream(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.complete = True

    def stop(self) -> None:
        self.timer.cancel()
        if self.listener is not None:
            self.listener.cancel()

    def _listen(self) -> None:
        if self.complete or self.listener is not None:
            return
        loop = asyncio.get_running_loop()
        if self.reading:  # the handler is reading the body right now: look again shortly
            self.timer = loop.call_later(self.middleware.watch_after, self._listen)
            return
        self.forwarded = asyncio.Queue()
        self.listener = loop.create_task(self._listener(self.forwarded))

    async def _listener(self, forwarded: asyncio.Queue[Message]) -> None:
        while True:
            message = await self.upstream()
            forwarded.put_nowait(message)
            if message["type"] == "http.disconnect":
                # Servers answer http.disconnect once the response is complete; only an early one cancels.
                if not self.complete:
                    self.disconnected = True
                    self.cancel_scope.cancel()
                return
