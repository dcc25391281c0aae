"""Accepting connections without refusing any in silence: gymhost's own accept loop in front of uvicorn's protocol,
and the process's limits set for the load Gym states (16k to 65k concurrent requests).

A process out of file descriptors cannot accept. uvloop (libuv) then accepts each waiting connection and closes it
at once (its "EMFILE trick"): the client sees the server hang up, and nothing is logged. So gymhost accepts itself
(``Acceptor``): the listening socket's readiness wakes a loop that accepts what is waiting and hands each connection
to uvicorn's HTTP protocol (``loop.connect_accepted_socket``); out of descriptors or memory, it stops accepting for
a moment, so the waiting connections stay queued in the kernel and are accepted as descriptors come free; it counts
that (``gymhost_accept_errors_total``) and says so, naming the limit and the fix, at most once every 10 s. When the
listen queue itself is full, the kernel refuses connections before any process sees them: ``ListenWatch`` counts
those from ``/proc/net/netstat`` (the host's, in its network namespace: every listening socket's, not this one's
alone) and says which setting caps the queue.

``raise_open_files_limit`` raises the soft limit of open files to the hard one, as Gym's launcher does, and says
when the hard limit is below what the stated load needs. ``gymhost serve`` calls it; ``create_app`` does not, having
no process side effects.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._logging import RateLimitedWarning
from .._metrics import accept_failed, listen_overflowed
from ._handoff import HandOff

__all__ = ["LOAD_OPEN_FILES", "Acceptor", "ListenWatch", "backlog_warning", "raise_open_files_limit", "somaxconn"]

logger = logging.getLogger("gymhost")

# Gym's stated load: "4k-65k concurrent requests" (its add-benchmark guide), each a connection, each a descriptor.
LOAD_OPEN_FILES = 65_536
_ACCEPT_BATCH = 256  # connections accepted per wakeup, so one burst does not hold the loop from the requests
_PAUSE_S = 0.1  # out of descriptors: how long the waiting connections are left queued before accepting again
_WARN_EVERY_S = 10.0
_WATCH_EVERY_S = 1.0
_OUT_OF = {errno.EMFILE: "descriptors", errno.ENFILE: "descriptors", errno.ENOBUFS: "memory", errno.ENOMEM: "memory"}


def raise_open_files_limit() -> list[str]:
    """Raise this process's soft limit of open files to its hard limit (the processes it starts inherit it), as
    Gym's launcher raises its own. Returns what to tell the operator: the limit raised, and a warning, with the fix,
    when the limit is below ``LOAD_OPEN_FILES``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, LOAD_OPEN_FILES)
    said = []
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as error:
            said.append(f"cannot raise the open files limit from {soft} to {target}: {error}")
            target = soft
        else:
            said.append(f"open files limit raised from {soft} to {target} (the hard limit)")
    if target < LOAD_OPEN_FILES:
        said.append(
            f"WARNING: this process may open only {target} files, and each connection is one: Gym's stated load is "
            f"16k-65k concurrent requests. Raise the hard limit to {LOAD_OPEN_FILES} or more (ulimit -Hn, systemd "
            "LimitNOFILE=, docker run --ulimit nofile=, or the container runtime's default)"
        )
    return said


def backlog_warning(backlog: int) -> str | None:
    """What to tell the operator when the kernel will cap the listen queue below ``backlog``."""
    cap = somaxconn()
    if cap is None or cap >= backlog:
        return None
    return f"the listen queue holds {cap} connections: the kernel caps --backlog {backlog} at net.core.somaxconn"


def somaxconn() -> int | None:
    """The kernel's cap on a listen queue (``net.core.somaxconn``), where it can be read."""
    try:
        return int(Path("/proc/sys/net/core/somaxconn").read_text())
    except (OSError, ValueError):
        return None


class Acceptor:
    """Accepts the connections of one listening socket and gives each to ``protocol_factory``'s protocol, as
    ``loop.create_server`` would; ``close`` and ``wait_closed`` are the ``asyncio.Server`` calls uvicorn's shutdown
    makes."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.Protocol],
        *,
        hand_off: bool = False,
    ) -> None:
        self.loop, self.sock, self.protocol_factory = loop, sock, protocol_factory
        self._tcp = sock.family in (socket.AF_INET, socket.AF_INET6)
        self._reading = False
        self._closed = False
        self._resume: asyncio.TimerHandle | None = None
        self._adopting: set[asyncio.Task[Any]] = set()
        self._warn = RateLimitedWarning(logger, _WARN_EVERY_S)
        # A worker's: each connection goes to the sibling owning its session, if another does (``_handoff``).
        self._hand_off = HandOff(loop, self.serve) if hand_off else None

    def start(self) -> None:
        self.sock.setblocking(False)
        self._read()

    def close(self) -> None:
        self._closed = True
        if self._resume is not None:
            self._resume.cancel()
        self._unread()
        if self._hand_off is not None:
            self._hand_off.close()

    async def wait_closed(self) -> None:
        if self._adopting:
            await asyncio.gather(*self._adopting, return_exceptions=True)

    def _read(self) -> None:
        if not self._reading and not self._closed:
            self.loop.add_reader(self.sock.fileno(), self._accept)
            self._reading = True

    def _unread(self) -> None:
        if self._reading:
            self.loop.remove_reader(self.sock.fileno())
            self._reading = False

    def _accept(self) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                connection, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # the client gave up while it waited: nothing to serve
            except OSError as error:
                if error.errno not in _OUT_OF:
                    raise
                self._out_of(_OUT_OF[error.errno])
                return
            connection.setblocking(False)
            if self._tcp:
                with contextlib.suppress(OSError):
                    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._hand_off is not None:
                self._hand_off.route(connection)
            else:
                self.serve(connection)

    def serve(self, connection: socket.socket) -> None:
        """Serve an accepted connection here (one this loop accepted, or one a sibling worker handed over)."""
        task = self.loop.create_task(self._adopt(connection))
        self._adopting.add(task)
        task.add_done_callback(self._adopting.discard)

    async def _adopt(self, connection: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self.protocol_factory, connection)
        except OSError as error:  # it went away before it was served
            connection.close()
            logger.debug("gymhost: an accepted connection was lost before it was served: %s", error)

    def _out_of(self, what: str) -> None:
        """Out of descriptors or memory: accept nothing for a moment (the connections wait in the kernel's queue)."""
        accept_failed(what)
        if what == "descriptors":
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            self._warn(
                "gymhost: cannot accept connections: this process has reached its limit of %d open files (each "
                "connection is one); waiting connections stay queued and are accepted as descriptors come free. "
                "Raise the limit: ulimit -Hn, systemd LimitNOFILE=, docker run --ulimit nofile=",
                soft,
            )
        else:
            self._warn("gymhost: cannot accept connections: the kernel is out of memory for sockets")
        self._unread()
        self._resume = self.loop.call_later(_PAUSE_S, self._read)


class ListenWatch:
    """The kernel's refusals of connections for a full listen queue (``ListenOverflows`` in ``/proc/net/netstat``:
    this network namespace's, every listening socket's), counted and said. It starts and stops with the server's
    listeners (``start``, ``close`` and ``wait_closed``, as ``Acceptor``'s), so uvicorn's own shutdown ends it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, backlog: int) -> None:
        self.loop, self.backlog = loop, backlog
        self._warn = RateLimitedWarning(logger, _WARN_EVERY_S)
        self._last = _listen_overflows()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = self.loop.create_task(self.run(), name="gymhost-listen-watch")

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def wait_closed(self) -> None:
        if self._task is not None:
            await asyncio.wait([self._task])  # ended by close(); waited for without taking its cancellation

    async def run(self) -> None:
        while True:
            await asyncio.sleep(_WATCH_EVERY_S)
            now = _listen_overflows()
            if now is None or self._last is None:
                continue
            if now > self._last:
                listen_overflowed(now - self._last)
                cap = somaxconn()
                self._warn(
                    "gymhost: the kernel refused %d connection(s) on this host because a listen queue was full "
                    "(this server's is %d; the kernel caps queues at net.core.somaxconn=%s): clients retry them "
                    "after a second. Raise --backlog and net.core.somaxconn (and net.ipv4.tcp_max_syn_backlog)",
                    now - self._last,
                    min(self.backlog, cap or self.backlog),
                    cap,
                )
            self._last = now


def _listen_overflows() -> int | None:
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return None
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            with contextlib.suppress(KeyError, ValueError):
                return int(table["ListenOverflows"])
    return None
