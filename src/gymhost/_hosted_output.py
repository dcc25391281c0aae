"""What hosted code prints: read by the server and logged as hosted code's, never written into the server's log as is.

A bundle's template and instances (and whatever they start) print to a socket the server reads, not to the server's
stderr: there, a line hosted code printed could pass for one of the server's own (an episode's end and its reward,
in the JSON lines a run's pipeline counts), and a line that is not JSON would break a JSON log. The server logs each
line through the ``gymhost.hosted`` logger at INFO, ``<folder>: <line>``, so it takes the log's format, level and
destination, its control characters escaped (no terminal escapes into an operator's terminal); in a process that
configured no logging at all, on stderr as before, named and escaped.

Logging a line costs the server's event loop a few microseconds, so hosted code could keep the loop busy by
printing: a socket is read for at most ``LINES_PER_S`` lines a second, and beyond that not read until the second is
over. Its writer then waits (the socket's buffer fills), the server does not, and the log says it was held back.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import sys
from typing import cast

from ._logging import RateLimitedWarning

__all__ = ["LINES_PER_S", "HostedOutput", "pair", "relay"]

logger = logging.getLogger("gymhost.hosted")

LINES_PER_S = 1000
_LINE_MAX = 8192  # the bytes of a line logged; the rest is cut, and said
_ESCAPED = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F) if code != 0x09}  # all control characters but tab


class HostedOutput(asyncio.Protocol):
    """The lines one socket brings, logged as ``name``'s, at most ``LINES_PER_S`` a second. Reading stops as soon as
    a read brings more than the second's share, so what waits here is at most one read's lines."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._transport: asyncio.Transport | None = None
        self._partial = bytearray()
        self._cutting = False  # the rest of a line too long, skipped up to its end
        self._lines: collections.deque[bytes] = collections.deque()
        self._ended = False  # every writer is gone: closed once what waits is logged
        self._window_ends = 0.0
        self._left = LINES_PER_S
        self._waiting: asyncio.TimerHandle | None = None
        self._held_back = RateLimitedWarning(logger)
        self._closed = asyncio.get_running_loop().create_future()

    async def said(self, timeout: float) -> None:
        """Wait, at most ``timeout``, until every writer is gone and what they printed is logged: before the server
        says a process of hosted code failed, what it printed as it failed (its traceback) is in the log above."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._closed), timeout)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is one, though not a subclass

    def data_received(self, data: bytes) -> None:
        *lines, rest = data.split(b"\n")
        for line in lines:
            if self._cutting:
                self._cutting = False
            else:
                self._lines.append(bytes(self._partial + line))
            self._partial.clear()
        if not self._cutting:
            self._partial += rest
            if len(self._partial) > _LINE_MAX:
                self._lines.append(bytes(self._partial[:_LINE_MAX]) + b" [cut]")
                self._partial.clear()
                self._cutting = True
        self._log()

    def eof_received(self) -> bool:
        if self._partial and not self._cutting:
            self._lines.append(bytes(self._partial))
        self._ended = True
        self._log()
        return True  # open until what waits is logged, at the same pace

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._closed.done():
            self._closed.set_result(None)
        if self._waiting is not None:
            self._waiting.cancel()
        for _ in range(min(len(self._lines), LINES_PER_S)):  # the server stops: a second's share more, and no wait
            self._say(self._lines.popleft())
        if self._lines:
            logger.warning("%s: %d lines its hosted code printed were not logged: the server stopped", self._name,
                           len(self._lines))  # fmt: skip

    def _resume(self) -> None:
        self._waiting = None
        self._log()

    def _log(self) -> None:
        now = asyncio.get_running_loop().time()
        if now >= self._window_ends:
            self._window_ends, self._left = now + 1.0, LINES_PER_S
        while self._lines and self._left > 0:
            self._say(self._lines.popleft())
            self._left -= 1
        assert self._transport is not None
        if self._transport.is_closing():
            return
        if self._lines:  # over this second's share: nothing more is read until the next
            if self._waiting is None:
                self._transport.pause_reading()
                self._waiting = asyncio.get_running_loop().call_at(self._window_ends, self._resume)
                self._held_back("%s: its hosted code prints more than %d lines a second: held back", self._name,
                                LINES_PER_S)  # fmt: skip
        elif self._ended:
            self._transport.close()
        elif not self._transport.is_reading():  # the next second: read again
            self._transport.resume_reading()

    def _say(self, line: bytes) -> None:
        text = line.removesuffix(b"\r").decode("utf-8", "replace").translate(_ESCAPED)
        if logger.hasHandlers():
            logger.info("%s: %s", self._name, text)
        else:  # a host that configured no logging at all: on stderr, as it was printed, but named and escaped
            print(f"{self._name}: {text}", file=sys.stderr, flush=True)


def pair() -> tuple[socket.socket, socket.socket]:
    """The server's end and the hosted process's (its stderr, and its stdout where it prints)."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


async def relay(ours: socket.socket, name: str) -> HostedOutput:
    """Log what comes on ``ours`` as ``name``'s, on this event loop, until every writer has closed its end."""
    _, output = await asyncio.get_running_loop().create_unix_connection(lambda: HostedOutput(name), sock=ours)
    return output
