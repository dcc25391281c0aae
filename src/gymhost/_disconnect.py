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
"""

from __future__ import annotations

import asyncio
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["DisconnectCancellationMiddleware"]

logger = logging.getLogger("gymhost")


class DisconnectCancellationMiddleware:
    def __init__(self, app: ASGIApp, *, watch_after: float = 0.1) -> None:
        self.app = app
        self.watch_after = watch_after
        self.num_cancelled = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = asyncio.current_task()
        if scope["type"] != "http" or handler is None:
            await self.app(scope, receive, send)
            return
        watch = _Watch(self, handler, receive)
        try:
            await self.app(scope, watch.receive, watch.send(send))
        except asyncio.CancelledError:
            if not watch.disconnected or handler.uncancel() > 0:
                raise  # cancelled for another reason too (the server is stopping): let it propagate
            self.num_cancelled += 1
            client = scope.get("client") or ("-", "-")
            logger.info('%s:%s - "%s %s" 499 client disconnected', *client, scope.get("method"), scope.get("path"))
        finally:
            watch.stop()


class _Watch:
    """One request: ``receive`` is the handler's until a listener takes it over, which only a slow request gets."""

    def __init__(
        self, middleware: DisconnectCancellationMiddleware, handler: asyncio.Task[object], receive: Receive
    ) -> None:
        self.middleware = middleware
        self.handler = handler
        self.upstream = receive
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

    def send(self, send: Send) -> Send:
        async def send_message(message: Message) -> None:
            if self.disconnected:
                return
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self.complete = True

        return send_message

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
                    self.handler.cancel()
                return
