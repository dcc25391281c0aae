"""Running an ASGI app on a socket, under uvicorn or hypercorn.

Configuration (``ServeConfig``) is kept apart from running, as uvicorn does. gymhost binds the listening socket
itself and hands it to the ASGI server: that is what lets ``--port 0`` report the port it got before the app
is built (the app is told its real address), and what turns a busy port into one clear ``ServeError`` line
instead of each server's own traceback.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from dataclasses import dataclass
from typing import Any, Literal

from ._exceptions import ServeError

__all__ = ["SERVERS", "ServeConfig", "bind_socket", "run_app", "url_of"]

ServerName = Literal["uvicorn", "hypercorn"]
SERVERS: tuple[ServerName, ...] = ("uvicorn", "hypercorn")


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    server: ServerName = "uvicorn"
    log_level: str = "info"
    # Longer than a trainer's client keep-alive, as Gym's launcher sets it, so the server never closes a
    # connection the client is about to reuse.
    timeout_keep_alive: int = 30


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


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def run_app(app: Any, sock: socket.socket, config: ServeConfig) -> None:
    """Serve ``app`` on ``sock`` until SIGINT or SIGTERM; both servers run the app's lifespan."""
    if config.server == "uvicorn":
        _run_uvicorn(app, sock, config)
    elif config.server == "hypercorn":
        _run_hypercorn(app, sock, config)
    else:
        raise ServeError(f"unknown server {config.server!r}; expected one of {', '.join(SERVERS)}")


def _run_uvicorn(app: Any, sock: socket.socket, config: ServeConfig) -> None:
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level=config.log_level,
            timeout_keep_alive=config.timeout_keep_alive,
            lifespan="on",
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
    hypercorn_config.accesslog = None
    # Without a shutdown trigger, hypercorn's serve() installs its own SIGINT/SIGTERM handlers.
    asyncio.run(serve(app, hypercorn_config))
