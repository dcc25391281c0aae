"""A candidate `_run_granian(app, sock, config)` for gymhost's _serving.py, tried outside the repo.

granian's embedded server (granian.server.embed.Server) runs in this process, on this process's asyncio loop, and
takes an app object (its target_loader returns `self.target` as is). It builds its own listener from
address/port; `_OnSocket` overrides `_init_shared_socket` so its one worker serves gymhost's pre-bound socket
instead (SocketHolder(fd, uds, backlog) is what granian itself passes between processes).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from typing import Any

import uvloop

from gymhost._config import ServeConfig
from gymhost._exceptions import ServeError
from gymhost._hosting._lifespan import LifespanRunner
from gymhost._serving._run import freeze_imported_heap


def run_app_granian(app: Any, sock: socket.socket, config: ServeConfig, *, lifespan_runner: bool = True) -> None:
    """run_app's shape, for granian: freeze, wrap in LifespanRunner, serve, turn a failed startup into ServeError."""
    freeze_imported_heap()
    lifespan = LifespanRunner(app) if lifespan_runner else app
    try:
        _run_granian(lifespan, sock, config)
    except (Exception, SystemExit) as error:
        if getattr(lifespan, "startup_error", None) is not None:
            raise ServeError(lifespan.startup_error) from None
        if isinstance(error, ServeError):
            raise
        raise ServeError(f"granian stopped: {error!r}; its log above says more") from error


def _run_granian(app: Any, sock: socket.socket, config: ServeConfig) -> None:
    try:
        from granian._granian import SocketHolder
        from granian.constants import HTTPModes, Interfaces
        from granian.http import HTTP1Settings
        from granian.log import LogLevels
        from granian.server.embed import Server
    except ImportError:
        raise ServeError("granian is not installed: pip install 'gymhost[granian]'") from None

    backlog = 2048  # bind_socket's listen(); granian calls listen() again with it, and bounds connections by it

    class _OnSocket(Server):
        def _init_shared_socket(self) -> None:
            # A duplicate, as for hypercorn: granian's listener owns the fd it is given, gymhost closes its own.
            self._ssp, self._shd = None, SocketHolder(os.dup(sock.fileno()), False, backlog)

    host, port = sock.getsockname()[:2]
    server = _OnSocket(
        app,
        address=host,  # only for its "Listening at" line
        port=port,
        interface=Interfaces.ASGI,  # with the lifespan protocol ("asginl" is without)
        http=HTTPModes.http1,  # as uvicorn: no HTTP/2 preface sniffing
        websockets=False,
        backlog=backlog,
        log_level=LogLevels(config.log_level),
        log_access=config.access_log,
        # hyper has no idle keep-alive timeout for HTTP/1; header_read_timeout is the nearest knob (ms).
        http1_settings=HTTP1Settings(keep_alive=True, header_read_timeout=config.timeout_keep_alive * 1000),
    )

    async def serve() -> None:
        loop, main = asyncio.get_running_loop(), asyncio.current_task()
        stopping: list[bool] = []

        def stop() -> None:
            if stopping:
                return
            stopping.append(True)
            server.stop()
            # The graceful timeout: granian waits for in-flight requests forever (workers_kill_timeout=None), and
            # with a timeout it cancels the worker before the lifespan's shutdown. Cancel the requests instead,
            # as uvicorn does; the worker then runs the lifespan's shutdown.
            loop.call_later(config.graceful_timeout, _cancel_requests, main)

        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop)
        await server.serve()
        if server.interrupt_children:  # the worker exited: the lifespan's startup failed (granian logged it)
            raise ServeError("granian stopped before serving; its log above says why")

    def _cancel_requests(keep: asyncio.Task[Any]) -> None:
        workers = {id(w._task) for w in server.wrks} | {id(w._wtask) for w in server.wrks}
        for task in asyncio.all_tasks():
            if task is not keep and id(task) not in workers:
                task.cancel()

    asyncio.run(serve(), loop_factory=uvloop.new_event_loop)


__all__ = ["run_app_granian"]
