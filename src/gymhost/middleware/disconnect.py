"""Cancel a request's handler when its client disconnects: nemo-gym 0.5+'s ``ClientDisconnectCancellationMiddleware``,
made cheap enough for tool calls.

Gym's middleware is right to exist: a trainer that gives up on a slow verify should not leave the server judging
for nobody. But it runs every request in an anyio task group with a cancel scope and a second task, which was the
largest single cost of a tool call in gymhost's profile, and even a plain asyncio listener task per request cost
more than the rest of gymhost's middleware together.

Most requests are over in milliseconds, long before a client would give up, so the listener is only started for
the ones that are not: a request still running after ``watch_after`` seconds (default 0.1; at most half as long
again, as one timer looks over all the requests in flight instead of a timer each) gets a listener that becomes
the only reader of the ASGI ``receive`` channel, forwards what it reads to the handler, and cancels the handler if
the client disconnects before the response is complete. Until then the handler reads ``receive`` itself, exactly
as without the middleware (the listener waits while the handler is reading, so the two never read at once).
Nothing is sent after a disconnect.

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
        self._in_flight = _InFlight(watch_after)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with anyio.CancelScope() as cancel_scope:
            watch = _Watch(cancel_scope, receive, send)
            in_flight = self._in_flight.add(watch)
            try:
                await self.app(scope, watch.receive, watch.send)
            finally:
                in_flight.pop(watch, None)  # unless a look gave it its listener already
                watch.stop()
        if watch.disconnected:
            client = scope.get("client") or ("-", "-")
            logger.info('%s:%s - "%s %s" 499 client disconnected', *client, scope.get("method"), scope.get("path"))


class _InFlight:
    """The requests in flight that have no listener yet, in the order they started, and one timer that looks over
    them while there are any: a timer per request (armed, then cancelled by nearly every one) cost more. Kept per
    event loop, as an app may be served on several (a test's, one per thread)."""

    def __init__(self, after: float) -> None:
        self.after = after
        self.loops: dict[asyncio.AbstractEventLoop, dict[_Watch, float]] = {}

    def add(self, watch: _Watch) -> dict[_Watch, float]:
        """Note a request as started now; what it is noted in, for the request to take itself out when done."""
        loop = asyncio.get_running_loop()
        started = self.loops.get(loop)
        if started is None:  # no timer runs on this loop: start one
            started = self.loops[loop] = {}
            loop.call_later(self.after, self._look, loop, started)
        started[watch] = loop.time()
        return started

    def _look(self, loop: asyncio.AbstractEventLoop, started: dict[_Watch, float]) -> None:
        due, listening = loop.time() - self.after, []
        for watch, since in started.items():
            if since > due:
                break  # and so are all after it
            if watch.listen():
                listening.append(watch)
        for watch in listening:
            del started[watch]
        if started:
            loop.call_later(self.after / 2, self._look, loop, started)
        else:  # nothing in flight here: the next request on this loop starts a timer again
            del self.loops[loop]


class _Watch:
    """One request: ``receive`` is the handler's until a listener takes it over, which only a slow request gets."""

    __slots__ = (
        "cancel_scope", "complete", "disconnected", "downstream", "forwarded", "listener", "reading", "upstream",
    )  # fmt: skip

    def __init__(self, cancel_scope: anyio.CancelScope, receive: Receive, send: Send) -> None:
        self.cancel_scope = cancel_scope
        self.upstream = receive
        self.downstream = send
        self.reading = 0
        self.complete = False
        self.disconnected = False
        self.listener: asyncio.Task[None] | None = None
        self.forwarded: asyncio.Queue[Message] | None = None

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
        if self.listener is not None:
            self.listener.cancel()

    def listen(self) -> bool:
        """Start the listener, unless the response is complete; False while the handler is reading the body (the
        next look tries again)."""
        if self.complete or self.listener is not None:
            return True
        if self.reading:
            return False
        self.forwarded = asyncio.Queue()
        self.listener = asyncio.get_running_loop().create_task(self._listener(self.forwarded))
        return True

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
