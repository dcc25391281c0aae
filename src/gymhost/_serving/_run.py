"""Running an ASGI app on a socket, under uvicorn or hypercorn.

Configuration (``ServeConfig``, in ``_config``) is kept apart from running, as uvicorn does. gymhost binds the
listening socket itself and hands it to the ASGI server: that is what lets ``--port 0`` report the port it got
before the app is built (the app is told its real address), and what turns a busy port into one clear
``ServeError`` line instead of each server's own traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import ipaddress
import logging
import os
import signal
import socket
import stat
from collections.abc import Iterator, Sequence
from typing import Any

import uvicorn

from .._config import SERVERS, ServeConfig
from .._drain import drain
from .._exceptions import ServeError
from .._hosting._lifespan import LifespanRunner
from .._logging import logging_config
from .._sessions._identity import process_state
from ._accepting import Acceptor, ListenWatch
from ._handoff import HandOffReceiver

logger = logging.getLogger("gymhost")

__all__ = [
    "bind_socket",
    "bind_unix_socket",
    "freeze_imported_heap",
    "held_collection",
    "inherited_socket",
    "is_loopback",
    "run_app",
    "url_of",
]


def freeze_imported_heap() -> None:
    """Move everything alive now out of the garbage collector's sight, once the app is built.

    What the imports created (nemo-gym imports Ray, MLflow, OpenAI and more: millions of objects) lives as long as
    the server; frozen, the collector stops walking it on every collection, which dominated the tail latency
    (benchmarks/README.md, "What made it fast"), and workers forked after it share those pages instead of writing
    to them. ``gymhost serve`` and ``asgi.py`` call this after building their app (``held_collection``).
    """
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def held_collection() -> Iterator[None]:
    """Build an app with the garbage collector off, and freeze what the build made once it is built: the imports
    create hundreds of thousands of objects that live as long as the server, and collecting as they are made walked
    them again and again, a tenth of a start's CPU (benchmarks/README.md, "The image"). The collector is on again
    afterwards, whether the build succeeded or raised, if it was on before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        freeze_imported_heap()
    finally:
        if enabled:
            gc.enable()


def bind_socket(host: str, port: int, backlog: int = ServeConfig.backlog) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port`` 0 takes a free one) whose queue holds ``backlog``
    connections not yet accepted (the kernel caps it at ``net.core.somaxconn``, which is said when it does).

    Not inheritable, as Python makes every descriptor: the server's workers are forked, and a confined server is
    handed it by name (``pass_fds``). An inheritable one (uvicorn and hypercorn make theirs so, for their workers)
    would reach every process the server's event loop starts: uvloop passes on every inheritable descriptor,
    whatever ``close_fds`` says (libuv has no such step), and code a Gym server runs for the model (Gym's local
    sandbox starts it so) could accept the trainer's requests, its own ``/verify`` among them, and answer them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise ServeError(f"{host}:{port} is already in use; choose another --port (0 picks a free one)") from None
        if error.errno == errno.EADDRNOTAVAIL or isinstance(error, socket.gaierror):
            raise ServeError(f"cannot bind {host}:{port}: {host} is not an address of this machine") from None
        raise ServeError(f"cannot bind {host}:{port}: {error.strerror or error}") from None
    return sock


def bind_unix_socket(path: str, backlog: int = ServeConfig.backlog) -> socket.socket:
    """A listening Unix socket at ``path``, replacing a stale socket file there; not inheritable (``bind_socket``)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.stat(path).st_mode):
            os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(backlog)
    except OSError as error:
        sock.close()
        raise ServeError(f"cannot listen on {path}: {error.strerror or error}") from None
    return sock


def inherited_socket(fd: int) -> socket.socket:
    """The listening socket this process inherited as ``fd`` (``ServeConfig.fd``)."""
    try:
        sock = socket.socket(fileno=fd)
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    except OSError as error:
        raise ServeError(f"file descriptor {fd}: not a socket this process holds ({error.strerror or error})") from None
    if not listening:
        sock.detach()
        raise ServeError(f"file descriptor {fd}: a socket, but not a listening one")
    sock.set_inheritable(False)  # the server's: not for the processes its code starts (forks keep it regardless)
    return sock


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach ``host`` (a name is resolved: "localhost" is loopback)."""
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def url_of(sock: socket.socket) -> str:
    if sock.family == socket.AF_UNIX:
        return f"unix:{sock.getsockname()}"
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def run_app(
    app: Any,
    sock: socket.socket,
    config: ServeConfig,
    extra_sockets: Sequence[socket.socket] = (),
    hand_off: socket.socket | None = None,
) -> None:
    """Serve ``app`` on ``sock`` (and ``extra_sockets``: a worker's socket for forwarded requests) until SIGINT or
    SIGTERM; both servers run the app's lifespan. ``hand_off``: a worker's socket where its siblings hand it the
    connections of its sessions (``_handoff``); uvicorn's only (hypercorn's accept loop is its own, and its workers
    forward), so ``_workers`` makes none under hypercorn."""
    freeze_imported_heap()
    lifespan = LifespanRunner(app)
    sockets = [sock, *extra_sockets]
    try:
        if config.server == "uvicorn":
            _run_uvicorn(lifespan, sockets, config, hand_off)
        elif config.server == "hypercorn":
            _run_hypercorn(lifespan, sockets, config)
        else:
            raise ServeError(f"unknown server {config.server!r}; expected one of {', '.join(SERVERS)}")
    except (Exception, SystemExit) as error:  # uvicorn exits, hypercorn raises, when the lifespan fails
        if lifespan.startup_error is not None:
            raise ServeError(lifespan.startup_error) from None
        if isinstance(error, ServeError):
            raise
        raise ServeError(f"{config.server} stopped: {error!r}; its log above says more") from error


def _run_uvicorn(app: Any, sockets: list[socket.socket], config: ServeConfig, hand_off: socket.socket | None) -> None:
    server = _DrainingUvicorn(
        uvicorn.Config(
            app,
            log_config=logging_config(config.log_format, config.log_level),
            log_level=config.log_level,
            access_log=config.access_log,
            timeout_keep_alive=config.timeout_keep_alive,
            timeout_graceful_shutdown=config.graceful_timeout,
            root_path=config.root_path,
            lifespan="on",
            # "auto" picks httptools and uvloop, both gymhost dependencies: several times h11 and asyncio's speed.
            http="auto",
            loop="auto",
        ),
        drain_timeout=config.drain_timeout,
        backlog=config.backlog,
        hand_off=hand_off,
    )
    server.run(sockets=sockets)
    if not server.started:
        raise ServeError("uvicorn stopped before serving; its log above says why")


class _DrainingUvicorn(uvicorn.Server):
    """uvicorn's server, with gymhost's own accept loop (``_accepting``: no connection refused in silence) and a
    drain before its shutdown (``_drain``): uvicorn's own graceful shutdown starts when the drain ends; a
    signal the drain does not take stops at once, as uvicorn's second signal does.

    Two methods are overridden, for want of a public way: ``startup`` (uvicorn has no hook for the accept loop: it
    calls ``loop.create_server``) and ``handle_exit`` (the signal handler ``serve`` installs). The rest is uvicorn's
    own: its ``shutdown`` closes and awaits what ``startup`` put in ``self.servers``, the listen watch among them.
    tests/test_uvicorn_internals_unit.py fails on a uvicorn whose methods these rely on were not read."""

    def __init__(self, config: Any, *, drain_timeout: float, backlog: int, hand_off: socket.socket | None) -> None:
        super().__init__(config)
        self.drain_timeout = drain_timeout
        self.backlog = backlog
        self.hand_off = hand_off
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: Any = None) -> None:
        """uvicorn's startup for the sockets gymhost bound, accepting with ``Acceptor`` instead of
        ``loop.create_server``."""
        self._loop = loop = asyncio.get_running_loop()
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            raise SystemExit(3)  # uvicorn's STARTUP_FAILURE: the lifespan said why
        config = self.config
        protocol_class: Any = config.http_protocol_class  # uvicorn's H11 or httptools protocol, built as it builds it

        def create_protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            protocol: asyncio.Protocol = protocol_class(
                config=config, server_state=self.server_state, app_state=self.lifespan.state, _loop=_loop
            )
            return protocol

        # The first socket is the one clients reach: a worker hands its connections to the siblings owning them.
        listeners: list[Any] = [
            Acceptor(loop, sock, create_protocol, hand_off=index == 0 and self.hand_off is not None)
            for index, sock in enumerate(sockets or [])
        ]
        if self.hand_off is not None and listeners:
            listeners.append(HandOffReceiver(loop, self.hand_off, listeners[0].serve))
        if process_state.worker == 0:  # the host's counter: one process of a replica reads it
            listeners.append(ListenWatch(loop, self.backlog))
        for listener in listeners:
            listener.start()
        self.servers = listeners  # uvicorn's shutdown calls close() and wait_closed() on each
        self.started = True

    def handle_exit(self, sig: int, frame: Any) -> None:
        loop = self._loop
        if loop is None or not drain.signalled():
            super().handle_exit(sig, frame)  # uvicorn's: exit, re-raising the signal once it has shut down
            self.force_exit = drain.draining or process_state.orphaned
            return

        async def drained() -> None:
            await drain.wait(self.drain_timeout)
            super(_DrainingUvicorn, self).handle_exit(sig, frame)

        def begin() -> None:
            loop.create_task(drained())

        loop.call_soon_threadsafe(begin)


def _run_hypercorn(app: Any, sockets: list[socket.socket], config: ServeConfig) -> None:
    try:
        from hypercorn.asyncio import serve
        from hypercorn.config import Config, Sockets
    except ImportError:
        raise ServeError("hypercorn is not installed: pip install hypercorn (gymhost's hypercorn extra)") from None

    class _Config(Config):
        def create_sockets(self) -> Sockets:
            """hypercorn makes the sockets it serves inheritable, for workers of its own; these are not for what the
            server's code starts (``bind_socket``)."""
            sockets = super().create_sockets()
            for sock in (*sockets.secure_sockets, *sockets.insecure_sockets, *sockets.quic_sockets):
                sock.set_inheritable(False)
            return sockets

    hypercorn_config = _Config()
    # A duplicate, because hypercorn closes the socket it was given and gymhost closes its own.
    hypercorn_config.bind = [f"fd://{os.dup(sock.fileno())}" for sock in sockets]
    hypercorn_config.loglevel = config.log_level.upper()
    hypercorn_config.keep_alive_timeout = config.timeout_keep_alive
    # hypercorn listens again on the socket it is given, with its own backlog (100 by default): the configured one
    hypercorn_config.backlog = config.backlog
    hypercorn_config.graceful_timeout = config.graceful_timeout
    hypercorn_config.root_path = config.root_path
    hypercorn_config.accesslog = "-" if config.access_log else None
    hypercorn_config.logconfig_dict = logging_config(config.log_format, config.log_level)

    async def main() -> None:
        # A shutdown trigger of our own: the first SIGTERM or SIGINT drains, then hypercorn shuts down gracefully;
        # a second one shuts down at once.
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        drains: list[asyncio.Task[None]] = []  # held, so the task is not collected while it runs

        def on_signal() -> None:
            if not drain.signalled():
                stop.set()
                return

            async def drained() -> None:
                await drain.wait(config.drain_timeout)
                stop.set()

            drains.append(loop.create_task(drained()))

        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, on_signal)
        await serve(app, hypercorn_config, shutdown_trigger=stop.wait)

    # On asyncio's own loop, as hypercorn's command runs by default: on uvloop, 256 connections had a tail of
    # seconds (benchmarks/README.md, "hypercorn's loop"), and libuv closes the connections it cannot accept for want
    # of descriptors where asyncio leaves them queued.
    asyncio.run(main())
