"""What hosted code prints: read by the server and logged as hosted code's, never written into the server's log as is.

A bundle's template and instances (and whatever they start) and agent-env's app print to a socket the server reads,
not to the server's stderr: there, a line hosted code printed could pass for one of the server's own (an episode's
end and its reward, in the JSON lines a run's pipeline counts), and a line that is not JSON would break a JSON log.
The server logs each line through the ``gymhost.hosted`` logger at INFO, ``<folder>: <line>``, so it takes the log's
format, level and destination, with every character that could end a line or drive a terminal escaped; in a process
that configured no logging at all, on stderr as before, named and escaped.

Reading and logging cost the server's event loop, so hosted code could keep the loop busy by printing: a socket is
read for at most ``BYTES_PER_S`` bytes and ``LINES_PER_S`` lines a second, a read past either is paid back before the
next (reading pauses; the writer waits, as the socket's buffer fills), lines are cut at ``LINE_MAX`` bytes, and at
most ``WAITING_MAX`` lines (four seconds' share) wait to be logged: past them, lines are dropped, and counted in a
warning that says the output was held back. The last lines are kept (``tail``) for the error that says why a process
failed to start, whatever the log's level.
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

__all__ = ["BYTES_PER_S", "LINES_PER_S", "LINE_MAX", "HostedOutput", "pair", "relay"]

logger = logging.getLogger("gymhost.hosted")

LINES_PER_S = 1000
BYTES_PER_S = 64 * 1024
LINE_MAX = 8192  # the bytes of a line logged; the rest is cut, and said
WAITING_MAX = 4 * LINES_PER_S  # more than one read of a few thousand lines brings, fewer than minutes of backlog
SAID_WITHIN_S = 2.0  # how long a process that failed to start is given for the rest of its output to be read
_TAIL = 15  # lines kept for an error
# Every character that ends a line somewhere (str.splitlines: \n, \r, \v, \f, \x1c-\x1e, \x85, U+2028, U+2029) or
# drives a terminal (C0 and C1 controls, DEL), as \xNN or \uNNNN; tab stays.
_ESCAPED = {
    code: (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    for code in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)
    if code != 0x09
}


class HostedOutput(asyncio.Protocol):
    """The lines one socket brings, logged as ``name``'s, within ``BYTES_PER_S`` and ``LINES_PER_S``."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._transport: asyncio.Transport | None = None
        self._partial = bytearray()
        self._cutting = False  # the rest of a line too long, skipped up to its end
        self._lines: collections.deque[bytes] = collections.deque()
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL)
        self._dropped = 0
        self._ended = False  # every writer is gone: closed once what waits is logged
        self._window_ends = 0.0
        self._lines_left = LINES_PER_S
        self._bytes_left = BYTES_PER_S  # below 0: a read past the share, paid back in the seconds after
        self._waiting: asyncio.TimerHandle | None = None
        self._held_back = RateLimitedWarning(logger)
        self._closed = asyncio.get_running_loop().create_future()

    async def said(self, timeout: float = SAID_WITHIN_S) -> None:
        """Wait, at most ``timeout``, until every writer is gone and what they printed is read: before the server says
        why a process of hosted code failed, what it printed as it failed is in ``tail`` (and in the log)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._closed), timeout)

    def last_lines(self) -> str:
        """What it printed last, for an error: a few lines, or that there were none."""
        return "\n".join(self.tail) if self.tail else "it printed nothing"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is one, though not a subclass

    def data_received(self, data: bytes) -> None:
        self._bytes_left -= len(data)
        *lines, rest = data.split(b"\n")
        for line in lines:
            if not self._cutting:
                self._keep(self._partial + line)
            self._partial.clear()
            self._cutting = False
        if not self._cutting:
            self._partial += rest
            if len(self._partial) > LINE_MAX:
                self._keep(self._partial)
                self._partial.clear()
                self._cutting = True
        self._log()

    def eof_received(self) -> bool:
        if self._partial:
            self._keep(self._partial)
            self._partial.clear()
        self._ended = True
        self._log()
        return True  # open until what waits is logged, at the same pace

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._closed.done():
            self._closed.set_result(None)
        if self._waiting is not None:
            self._waiting.cancel()
        while self._lines:  # the server stops: what waits here (at most WAITING_MAX), said now
            self._say(self._lines.popleft())

    def _keep(self, line: bytes | bytearray) -> None:
        if len(self._lines) >= WAITING_MAX:
            self._dropped += 1
            return
        self._lines.append(bytes(line[:LINE_MAX]) + b" [cut]" if len(line) > LINE_MAX else bytes(line))

    def _resume(self) -> None:
        self._waiting = None
        self._log()

    def _log(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now >= self._window_ends:
            self._window_ends, self._lines_left = now + 1.0, LINES_PER_S
            self._bytes_left = min(self._bytes_left + BYTES_PER_S, BYTES_PER_S)
        while self._lines and self._lines_left > 0:
            self._say(self._lines.popleft())
            self._lines_left -= 1
        assert self._transport is not None
        if self._transport.is_closing():
            return
        # Over this second's share: nothing more is read until it is paid (once every writer is gone, nothing more
        # is read at all: only the lines waiting hold it open).
        if self._lines or (self._bytes_left <= 0 and not self._ended):
            if self._waiting is None:
                self._transport.pause_reading()
                self._waiting = loop.call_at(self._window_ends, self._resume)
                self._held_back(
                    "%s: its hosted code prints more than %d lines or %d bytes a second: held back (%d lines dropped)",
                    self._name,
                    LINES_PER_S,
                    BYTES_PER_S,
                    self._dropped,
                )
        elif self._ended:
            self._transport.close()
        elif not self._transport.is_reading():  # paid: read again
            self._transport.resume_reading()

    def _say(self, line: bytes) -> None:
        text = line.removesuffix(b"\r").decode("utf-8", "replace").translate(_ESCAPED)
        self.tail.append(text)
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
