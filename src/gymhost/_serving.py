"""Running an ASGI app on a socket, under uvicorn or hypercorn.

Configuration (``ServeConfig``) is kept apart from running, as uvicorn does. gymhost binds the listening socket
itself and hands it to the ASGI server: that is what lets ``--port 0`` report the port it got before the app
is built (the app is told its real address), and what turns a busy port into one clear ``ServeError`` line
instead of each server's own traceback.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import ipaddress
import os
import socket
import traceback
from dataclasses import dataclass
from typing import Any, Literal

from ._exceptions import GymhostError, ServeError

__all__ = ["SERVERS", "ServeConfig", "bind_socket", "is_loopback", "run_app", "url_of"]

ServerName = Literal["uvicorn", "hypercorn"]
SERVERS: tuple[ServerName, ...] = ("uvicorn", "hypercorn")


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    server: ServerName = "uvicorn"
    log_level: str = "info"
    # Off by default, as under Gym's launcher: a line per tool call costs more than the call at high load.
    access_log: bool = False
    # Longer than a trainer's client keep-alive, as Gym's launcher sets it, so the server never closes a
    # connection the client is about to reuse.
    timeout_keep_alive: int = 30
    # On SIGTERM or SIGINT, requests in flight get this long to finish; then they are cancelled and the app's
    # lifespan shuts down (a written agent environment ends its open episodes and stops its instances).
    graceful_timeout: int = 30


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port`` 0 takes a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise ServeError(f"{host}:{port} is already in use; choose another --port (0 picks a free one)") from None
        if error.errno == errno.EADDRNOTAVAIL or isinstance(error, socket.gaierror):
            raise ServeError(f"cannot bind {host}:{port}: {host} is not an address of this machine") from None
        raise ServeError(f"cannot bind {host}:{port}: {error.strerror or error}") from None
    sock.set_inheritable(True)
    return sock


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach ``host`` (a name is resolved: "localhost" is loopback)."""
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def run_app(app: Any, sock: socket.socket, config: ServeConfig) -> None:
    """Serve ``app`` on ``sock`` until SIGINT or SIGTERM; both servers run the app's lifespan."""
    # What is alive now (nemo-gym imports Ray, MLflow, OpenAI and more: millions of objects) lives as long as the
    # server; frozen, the collector stops walking it, which took p99 latency from tens to hundreds of ms.
    gc.collect()
    gc.freeze()
    lifespan = _Lifespan(app)
    try:
        if config.server == "uvicorn":
            _run_uvicorn(lifespan, sock, config)
        elif config.server == "hypercorn":
            _run_hypercorn(lifespan, sock, config)
        else:
            raise ServeError(f"unknown server {config.server!r}; expected one of {', '.join(SERVERS)}")
    except (Exception, SystemExit) as error:  # uvicorn exits, hypercorn raises, when the lifespan fails
        if lifespan.startup_error is not None:
            raise ServeError(lifespan.startup_error) from None
        if isinstance(error, ServeError):
            raise
        raise ServeError(f"{config.server} stopped: {error!r}; its log above says more") from error


class _Lifespan:
    """The app's lifespan, run for the ASGI server, with gymhost's own startup errors reported as one line.

    Starlette hands the ASGI server a formatted traceback when a lifespan fails; a folder whose environment will
    not start deserves the one-line message its ``GymhostError`` carries, like every other gymhost error. Anything
    else keeps its traceback. Apps without a Starlette router pass through untouched.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.startup_error: str | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        router: Any = getattr(self.app, "router", None)
        if not hasattr(router, "lifespan_context"):
            await self.app(scope, receive, send)
            return
        await receive()  # lifespan.startup
        context = router.lifespan_context(self.app)
        try:
            state = await context.__aenter__()
        except GymhostError as error:
            self.startup_error = str(error)
            await send({"type": "lifespan.startup.failed", "message": ""})
            return
        except BaseException:
            await send({"type": "lifespan.startup.failed", "message": traceback.format_exc()})
            return
        if state and "state" in scope:
            scope["state"].update(state)
        await send({"type": "lifespan.startup.complete"})
        await receive()  # lifespan.shutdown
        try:
            await context.__aexit__(None, None, None)
        except BaseException:
            await send({"type": "lifespan.shutdown.failed", "message": traceback.format_exc()})
            return
        await send({"type": "lifespan.shutdown.complete"})


def _run_uvicorn(app: Any, sock: socket.socket, config: ServeConfig) -> None:
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level=config.log_level,
            access_log=config.access_log,
            timeout_keep_alive=config.timeout_keep_alive,
            timeout_graceful_shutdown=config.graceful_timeout,
            lifespan="on",
            # "auto" picks httptools and uvloop, both gymhost dependencies: several times h11 and asyncio's speed.
            http="auto",
            loop="auto",
        )
    )
    server.run(sockets=[sock])
    if not server.started:
        raise ServeError("uvicorn stopped before serving; its log above says why")


def _run_hypercorn(app: Any, sock: socket.socket, config: ServeConfig) -> None:
    try:
        from hypercorn.asyncio import serve
        from hypercorn.config import Config
    except ImportError:
        raise ServeError("hypercorn is not installed: pip install 'gymhost[hypercorn]'") from None

    hypercorn_config = Config()
    # A duplicate, because hypercorn closes the socket it was given and gymhost closes its own.
    hypercorn_config.bind = [f"fd://{os.dup(sock.fileno())}"]
    hypercorn_config.loglevel = config.log_level.upper()
    hypercorn_config.keep_alive_timeout = config.timeout_keep_alive
    hypercorn_config.graceful_timeout = config.graceful_timeout
    hypercorn_config.accesslog = "-" if config.access_log else None
    # Without a shutdown trigger, hypercorn's serve() installs its own SIGINT/SIGTERM handlers.
    asyncio.run(serve(app, hypercorn_config), loop_factory=_uvloop_factory())


def _uvloop_factory() -> Any:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
