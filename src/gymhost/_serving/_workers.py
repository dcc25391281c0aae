"""Several worker processes on one host: ``gymhost serve --workers N``.

The supervisor (the process ``gymhost serve`` started in) binds the listening socket and builds the app once, then
forks N workers from that state; each runs the app's lifespan and serves the shared socket, and the kernel hands each
new connection to one of them. Every session names the worker that seeded it, so a request reaches the worker
holding its episode whichever worker accepted the connection: the accepting worker hands the connection itself to
its owner (``_handoff``, over the owner's ``worker-<i>.handoff`` socket), and what cannot be handed over (a
keep-alive connection's later request for another worker, a head that came in pieces) is forwarded over the owner's
``worker-<i>.forwards`` socket (``_sessions._forwarding``).

Why workers that route among themselves rather than a front process routing every request by owner: the kernel's
spread of connections already balances new episodes, and a hand-off costs the accepting worker a peek and a
``sendmsg``, where a front would parse every request of every worker on one core (the benchmarks measure the
hand-off and the forward).

The supervisor restarts a worker that dies; the sessions it held are lost, and answered as such (410, or a masked
``session_lost`` verdict) by the new worker, whose start differs. SIGTERM or SIGINT reaches every worker, and each
drains until every worker's episodes have ended, which the workers tell each other as they drain
(``_drain.WorkerCounts``: the supervisor marks the replica draining, and says when a worker has exited); a second
one stops them at once. The supervisor holds the stop signals while it forks, so that no worker misses one. Workers
die with the supervisor, SIGKILL included: the kernel signals them when it dies (``PR_SET_PDEATHSIG``,
``_sessions._identity``'s ``follow_parent``) and, their supervisor gone, they stop at once rather than drain, so the
port is free within seconds for the server an operator starts in its place. Metrics are aggregated across workers by
prometheus_client's multiprocess mode, in a folder the supervisor makes before any metric has a value. What a worker
made under the temporary directory and could not remove, killed, the supervisor removes as it reaps it (``_scratch``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._config import ServeConfig
from .._drain import WorkerCounts
from .._exceptions import GymhostError, ServeError
from .._metrics import share_metrics
from .._scratch import remove_orphaned, scratch_folder
from .._sessions._identity import process_state
from .._sessions._signing import process_secret
from ._run import bind_unix_socket

__all__ = ["prepare_workers", "serve_workers"]

logger = logging.getLogger("gymhost")

_START_GRACE_S = 10.0  # a worker that exits sooner than this after its start failed to start
_START_FAILURES = 3  # consecutive failed starts before the supervisor gives up
_STOPS = {signal.SIGTERM, signal.SIGINT}


def prepare_workers() -> Path:
    """Before anything builds an app: the folder where workers listen, keep their metrics and tell each other their
    drain (the caller removes it when they are done), and one signing secret for all of them, made here so that the
    forks carry it in their memory (each worker's own would refuse its siblings' cookies)."""
    folder = scratch_folder("workers")
    share_metrics(folder / "metrics")
    process_secret()
    return folder


def serve_workers(
    app: Any, sock: socket.socket, config: ServeConfig, workers: int, folder: Path, run: Callable[..., None]
) -> None:
    """Fork ``workers`` workers serving ``app`` on ``sock`` (``run`` is ``_serving.run_app``) and keep them up
    until a signal stops them all."""
    if _hands_off(config) and sock.family in (socket.AF_INET, socket.AF_INET6):
        # The kernel wakes an accept only once the request has arrived: the hand-off reads its owner at once,
        # instead of each worker waiting, connection by connection, for its head (``_handoff``).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 1)
    _Supervisor(app, sock, config, workers, folder, run).run()


class _Supervisor:
    def __init__(
        self, app: Any, sock: socket.socket, config: ServeConfig, workers: int, folder: Path, run: Callable[..., None]
    ) -> None:
        self.app, self.sock, self.config, self.workers, self.folder, self.run_app = (
            app,
            sock,
            config,
            workers,
            folder,
            run,
        )
        self.children: dict[int, tuple[int, float]] = {}  # pid -> (worker index, when it started)
        self.counts = WorkerCounts(folder)
        self.stopping = 0  # signals received
        self.failures = 0

    def run(self) -> None:
        for index in range(self.workers):
            self._spawn(index)
        handlers = {signum: signal.signal(signum, self._on_signal) for signum in _STOPS}
        try:
            while self.children:
                pid, status = os.wait()
                if pid not in self.children:
                    continue
                index, started = self.children.pop(pid)
                self._forget(pid, index)
                if self.stopping:
                    continue
                code = os.waitstatus_to_exitcode(status)
                if code != 0 and time.monotonic() - started < _START_GRACE_S:
                    self.failures += 1
                    if self.failures >= _START_FAILURES:
                        self._stop_all(signal.SIGKILL)
                        raise ServeError(
                            f"worker {index} failed to start {self.failures} times; its log above says why"
                        )
                    time.sleep(1.0)
                    if self.stopping:  # a signal during the pause: no worker is started after it
                        continue
                else:
                    self.failures = 0
                logger.warning("worker %d (pid %d) exited with %d; starting it again", index, pid, code)
                self._spawn(index)
        finally:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        """The first signal drains every worker; a second stops them at once (each worker counts its own)."""
        self.stopping += 1
        if self.stopping == 1:
            self.counts.mark_draining()  # before any worker's drain begins, so that each waits for them all
        self._stop_all(signum)

    def _stop_all(self, signum: int) -> None:
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def _forget(self, pid: int, index: int) -> None:
        """A worker has exited: its episodes are over for its siblings' drain, its live gauges no longer count, and
        what it made under the temporary directory goes (it removes it itself unless it was killed)."""
        self.counts.gone(index)
        with contextlib.suppress(Exception):
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
        remove_orphaned()

    def _spawn(self, index: int) -> None:
        parent = os.getpid()
        self.counts.started(index)
        # A stop signal waits until the worker is among the children it goes to (and the worker has its own handling).
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
        try:
            pid = os.fork()
        except BaseException:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            raise
        if pid:
            self.children[pid] = (index, time.monotonic())
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            return
        code = 1
        try:
            code = self._worker(index, parent)
        except GymhostError as error:  # logged as the server logs (JSON lines under --log-format json)
            logger.error("worker %d: %s", index, error)
        except BaseException:
            logger.exception("worker %d failed", index)
        finally:
            os._exit(code)

    def _worker(self, index: int, parent: int) -> int:
        """In the forked worker: die with the supervisor, take an identity, listen for forwards, serve."""
        process_state.follow_parent(parent)  # the supervisor killed: stop at once, with nobody left to drain for
        for signum in _STOPS:
            signal.signal(signum, signal.SIG_DFL)  # the ASGI server installs its own
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)  # held while the supervisor forked this worker
        process_state.become_worker(index, str(self.folder))
        # Its own Unix sockets (replacing what a worker of the same index left behind): a burst forwards thousands
        # of requests at once; connections are handed over by the few siblings, each over one connection it keeps.
        forwards = bind_unix_socket(process_state.worker_socket(index, "forwards"), self.config.backlog)
        hand_off = (
            bind_unix_socket(process_state.worker_socket(index, "handoff"), 16) if _hands_off(self.config) else None
        )
        self.run_app(self.app, self.sock, self.config, extra_sockets=[forwards], hand_off=hand_off)
        return 0


def _hands_off(config: ServeConfig) -> bool:
    """Whether workers hand connections over: asked for, and under uvicorn (hypercorn accepts by itself)."""
    return config.hand_off and config.server == "uvicorn"
