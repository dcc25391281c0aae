"""Handing a connection to the worker that owns its session, instead of forwarding its requests through this one.

Under ``gymhost serve --workers N`` the kernel gives each new connection to whichever worker accepts first, and
verifiers opens a new connection for every call: (N-1)/N of an episode's calls land on a worker that does not hold
it. Forwarding them (``_sessions._forwarding``) costs that worker a whole request (the middleware stack, an httpx
round trip over the owner's Unix socket) and the owner a second parse. Instead, the accepting worker looks at the
request head without consuming it (``MSG_PEEK``), reads the owner from the session cookie or MCP token, and, when a
sibling owns it, passes the connection itself to that sibling (``SCM_RIGHTS`` over the sibling's hand-off socket,
``worker-<i>.handoff``). The sibling adopts it as if it had accepted it (``Acceptor.serve``) and reads the request
from the kernel's buffer: one process parses it, and it answers the client directly.

The owner is read without checking the signature: a hand-off only decides which worker reads the request, and that
worker checks the cookie or token as for any request (a forged owner costs at most the forward it would have cost).
The workers' listening socket defers accepts until a request has arrived (``TCP_DEFER_ACCEPT``, set by
``_workers``), so the peek finds the head at once; a connection that has sent nothing yet (a Unix socket's) is waited
for, up to ``_WAIT_S``. What a hand-off cannot serve keeps today's forward: a head that did not arrive whole in its
first segment, a keep-alive connection whose later request belongs to another worker, another replica's session, a
sibling that is gone or whose hand-off socket is full (counted in ``gymhost_handoffs_total``, then forwarded).
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Any

from .._descriptors import received_fds
from .._logging import RateLimitedWarning
from .._metrics import handed_off
from .._sessions._identity import process_state
from .._sessions._owner import head_owner

__all__ = ["HandOff", "HandOffReceiver"]

logger = logging.getLogger("gymhost")

_PEEK_BYTES = 16_384  # a request head with Gym's cookie fits in far less; a body beyond it is not read
_WAIT_S = 1.0  # a connection that has sent nothing yet: how long to wait for its head before serving it here
_RECEIVE_BATCH = 256  # connections received per wakeup, as the accept loop takes them
_warn = RateLimitedWarning(logger)

Serve = Callable[[socket.socket], None]


class HandOff:
    """On the accepting side: each accepted connection goes to its owner's hand-off socket, or to ``serve``."""

    def __init__(self, loop: Any, serve: Serve) -> None:
        self.loop, self.serve = loop, serve
        self._siblings: dict[int, socket.socket] = {}  # worker index -> connected hand-off socket
        self._waiting: dict[int, tuple[socket.socket, Any]] = {}  # fd -> (connection, its timer)

    def route(self, connection: socket.socket) -> None:
        try:
            head = connection.recv(_PEEK_BYTES, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            self._wait(connection)
            return
        except OSError:
            head = b""  # reset already: served here, where reading it says so
        self._dispatch(connection, head)

    def close(self) -> None:
        for fd, (connection, timer) in list(self._waiting.items()):
            timer.cancel()
            self.loop.remove_reader(fd)
            connection.close()  # it never sent a request: closed as an idle connection is at shutdown
        self._waiting.clear()
        for sibling in self._siblings.values():
            sibling.close()
        self._siblings.clear()

    def _wait(self, connection: socket.socket) -> None:
        fd = connection.fileno()
        timer = self.loop.call_later(_WAIT_S, self._stop_waiting, fd, False)
        self._waiting[fd] = (connection, timer)
        self.loop.add_reader(fd, self._stop_waiting, fd, True)

    def _stop_waiting(self, fd: int, readable: bool) -> None:
        connection, timer = self._waiting.pop(fd)
        timer.cancel()
        self.loop.remove_reader(fd)
        head = b""
        if readable:
            with contextlib.suppress(OSError):
                head = connection.recv(_PEEK_BYTES, socket.MSG_PEEK)
        self._dispatch(connection, head)

    def _dispatch(self, connection: socket.socket, head: bytes) -> None:
        index = process_state.sibling(head_owner(head)) if head else None
        if index is not None and self._send(index, connection):
            connection.close()  # the owner holds its own descriptor of the same connection
            return
        self.serve(connection)

    def _send(self, index: int, connection: socket.socket) -> bool:
        for attempt in range(2):  # a sibling restarted since its socket was connected: connect again, once
            sibling = self._sibling(index)
            if sibling is None:
                return self._failed(index, "owner_gone")
            try:
                socket.send_fds(sibling, [b"\0"], [connection.fileno()])
            except (BlockingIOError, InterruptedError):
                return self._failed(index, "owner_busy")
            except OSError:
                self._siblings.pop(index).close()
                if attempt:
                    return self._failed(index, "owner_gone")
                continue
            handed_off("sent")
            return True
        return False

    def _sibling(self, index: int) -> socket.socket | None:
        sibling = self._siblings.get(index)
        if sibling is None:
            path = process_state.worker_socket(index, "handoff")
            sibling = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sibling.setblocking(False)
            try:
                sibling.connect(path)
            except OSError:  # not there, not listening, or its queue full: this time, the forward
                sibling.close()
                return None
            self._siblings[index] = sibling
        return sibling

    def _failed(self, index: int, outcome: str) -> bool:
        handed_off(outcome)
        _warn("gymhost: could not hand a connection to worker %d, which owns its session (%s); its request is "
              "forwarded instead", index, outcome.replace("_", " "))  # fmt: skip
        return False


class HandOffReceiver:
    """On the owning side: the connections siblings hand over, each given to ``serve`` as if accepted here. It
    closes with the server's listening sockets (``close`` and ``wait_closed``, as uvicorn's shutdown calls them)."""

    def __init__(self, loop: Any, sock: socket.socket, serve: Serve) -> None:
        self.loop, self.sock, self.serve = loop, sock, serve
        self._senders: dict[int, socket.socket] = {}

    def start(self) -> None:
        self.sock.setblocking(False)
        self.loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()  # siblings' next hand-offs fail, and go by the forward
        for fd, sender in list(self._senders.items()):
            self._receive(fd)  # what was already handed over is served, not reset by closing it
            self._forget(fd, sender)

    async def wait_closed(self) -> None:
        return None

    def _accept(self) -> None:
        while True:
            try:
                sender, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            sender.setblocking(False)
            self._senders[sender.fileno()] = sender
            self.loop.add_reader(sender.fileno(), self._receive, sender.fileno())

    def _receive(self, fd: int) -> None:
        sender = self._senders.get(fd)
        if sender is None:
            return
        for _ in range(_RECEIVE_BATCH):
            try:
                data, fds, flags = received_fds(sender, _RECEIVE_BATCH, _RECEIVE_BATCH)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, fds, flags = b"", [], 0
            if flags & socket.MSG_CTRUNC:  # out of descriptors: the kernel closed what it could not give
                handed_off("dropped")
                _warn("gymhost: connections handed over by a sibling worker were dropped: this process is out of "
                      "descriptors (raise the open-files limit)")  # fmt: skip
            for received in fds:  # not inheritable: no process the server's code starts holds the trainer's connection
                connection = socket.socket(fileno=received)
                connection.setblocking(False)
                self.serve(connection)
            if not data:  # the sibling closed its end (it stopped)
                self._forget(fd, sender)
                return

    def _forget(self, fd: int, sender: socket.socket) -> None:
        if self._senders.pop(fd, None) is not None:
            self.loop.remove_reader(fd)
            sender.close()
