"""``Server(config).run()``: the serve program, as ``gymhost serve`` runs it, for any caller.

Everything that can fail is checked in the order a user can fix it, and before the slow part: what to serve
(``_hosting._targets``: a typo is one line), whether this environment meets a single folder's requirements (else
refused with the ``--venv`` hint, or served from its own venv), then the port (a busy port is one line, before
nemo-gym is imported). Only then is the app built and served: the process's identity set (``process_state``), the
open-files limit raised (said only where it matters: beyond loopback), the drain wired, one process or workers.
Whatever a server makes under the temporary directory goes when it stops, SIGTERM included (``_Stopped``), and what
a killed one left goes when the next one starts (``_scratch``).
"""

from __future__ import annotations

import logging
import logging.config
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .._config import ServeConfig, configured_sandbox, secret_settings, take_parent_pid
from .._exceptions import ConfinementError, ServeError
from .._hosting._targets import Target, resolve_targets
from .._keys import MOUNT
from .._scratch import remove, remove_orphaned, scratch_folder

__all__ = ["Server"]

logger = logging.getLogger("gymhost")


def _is_loopback(host: str) -> bool:
    from ._run import is_loopback

    return is_loopback(host)


class _Stopped(BaseException):
    """SIGTERM, as an exception, so that what the server made is removed before the process dies by it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def _dying_by_sigterm_after_cleanup() -> Iterator[Callable[[], None]]:
    """uvicorn ends a graceful shutdown by raising the signal that began it again, with the handler it found: the
    default one would kill the process there, before the cleanup that follows the run. With this one, the signal
    unwinds the run as an exception (as SIGINT does, as ``KeyboardInterrupt``), and the process dies by it once
    the block's cleanup is done, as uvicorn meant: its exit status says SIGTERM. A SIGTERM while the app is
    being built ends it the same way, whatever its exception became on the way out; and the block is given a
    check that raises it again, for a signal whose exception something in the build swallowed (importlib's
    module-lock callback, a finalizer it landed in: "Exception ignored"), called before serving. Off the main
    thread, where no signal handler can be set (nor does uvicorn set one), the block runs as it is."""
    received: list[int] = []

    def stop_if_signalled() -> None:
        if received:
            raise _Stopped(received[0])

    if threading.current_thread() is not threading.main_thread():
        yield stop_if_signalled
        return

    def stopped(signum: int, frame: Any) -> None:
        received.append(signum)
        raise _Stopped(signum)

    previous = signal.signal(signal.SIGTERM, stopped)
    try:
        yield stop_if_signalled
    except BaseException:
        if not received:
            raise
        # Stopped: by its exception, or by whatever the exception became (pydantic wraps one raised while it
        # builds a schema in its own error, and the build then fails with it).
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)
        raise  # not reached: the signal ends the process
    finally:
        signal.signal(signal.SIGTERM, previous)


def _print(line: str) -> None:
    print(f"gymhost: {line}", file=sys.stderr if line.startswith("WARNING") else sys.stdout, flush=True)


def _print_json(line: str) -> None:
    """A line said under ``--log-format json``: a record of the ``gymhost`` logger, where the text line would go."""
    from .._logging import json_line

    warning = line.startswith("WARNING: ")
    level, message = (logging.WARNING, line.removeprefix("WARNING: ")) if warning else (logging.INFO, line)
    print(json_line("gymhost", level, message), file=sys.stderr if warning else sys.stdout, flush=True)


class Server:
    """``say`` prints what the operator should know (default: a ``gymhost:`` line on stdout, warnings on stderr);
    under ``--log-format json`` each is a JSON record instead, whatever ``say`` is."""

    def __init__(self, config: ServeConfig, *, say: Callable[[str], None] = _print) -> None:
        self.config = config
        self.say = _print_json if config.log_format == "json" else say
        self._secret = ""  # what sessions are signed with, in words (``_signing.describe_secret``)
        self._stop_if_signalled: Callable[[], None] = lambda: None  # ``_dying_by_sigterm_after_cleanup``'s check

    def run(self) -> None:
        """Serve until SIGTERM or SIGINT (a first one drains, a second stops at once)."""
        from .._confinement import not_dumpable
        from .._sessions._identity import process_state
        from .._sessions._signing import describe_secret
        from ._confined import confined_server, exit_as, serve_confined

        not_dumpable()  # before it holds the secret or a socket: what it runs for the model is its user
        config = self.config
        target = self._resolve()
        parent = take_parent_pid()
        if parent is not None:  # another gymhost process started this one (a gateway's process mount): die with it
            process_state.follow_parent(parent)
        remove_orphaned()  # what a server killed before this start left behind
        # Said with the start line; before workers share the secret. A confined server's is its supervisor's.
        self._secret = self._secret or describe_secret()
        confined = confined_server(target, config)
        if confined is not None:  # a Gym server under --sandbox strict: served from a sandbox, this process outside
            sock = self._listen()
            try:
                status = serve_confined(config, sock, confined, self._secret, self.say)
            finally:
                sock.close()
            if status:
                exit_as(status)
            return
        with _dying_by_sigterm_after_cleanup() as self._stop_if_signalled:
            shared = self._share(target)
            try:
                self._run(target, shared if config.workers > 1 else None)
            finally:
                if shared is not None:
                    remove(shared)

    def _run(self, target: Target, workers_folder: Path | None) -> None:
        sock = self._listen()
        try:
            self._say_limits()
            self._serve(target, sock, workers_folder)
        finally:
            sock.close()

    def _listen(self) -> socket.socket:
        """The listening socket, where the token allows it: beyond loopback, only with a token or ``--no-token``."""
        config = self.config
        inherited = config.fd is not None  # its supervisor checked the address it bound
        if not inherited and config.uds is None and config.app.token is None and not _is_loopback(config.host):
            if not config.no_token:
                raise ServeError(
                    f"serving on {config.host} with no token would let anyone who can reach this port seed, play and "
                    "verify episodes and read the pool: set GYMHOST_TOKEN (or --token), serve on 127.0.0.1, or pass "
                    "--no-token if something in front keeps everyone else out"
                )
            self.say(f"serving on {config.host} with no token (--no-token): whatever is in front must guard the port")
        return self._bind()

    def load(self) -> Any:
        """The app ``run`` serves, built the same way, for an ASGI server that imports it by name (``gymhost.asgi``):
        what to serve resolved and a folder's requirements checked, the open-files limit raised, this replica's
        identity set, the app built, the folder entered. That server binds, accepts and stops it; what ``run`` adds
        around it (gymhost's accept loop, the drain, workers) is ``gymhost serve``'s alone."""
        from .._confinement import not_dumpable
        from ._accepting import raise_open_files_limit
        from ._confined import confined_server

        not_dumpable()  # as ``run``: the ASGI server's process serves what this builds
        target = self._resolve()
        if confined_server(target, self.config) is not None:
            raise ConfinementError(
                f"--sandbox strict: {target.name} is a Gym server, whose own process only gymhost serve confines "
                "(its sandbox is started around the server, before it is imported): serve it with gymhost serve, "
                "or with another --sandbox"
            )
        for line in raise_open_files_limit():
            logger.debug("%s", line)
        return self._build(target, None)

    # -- the checks, in the order they are made --------------------------------------------------------------------

    def _resolve(self) -> Target:
        config = self.config
        target = resolve_targets(config.paths, only=config.only)
        if target.gateway and (config.name or config.config_key or config.overrides):
            raise ServeError("--name, --config-key and --set apply to one server's folder, not to several")
        if target.folder is not None:
            self._check_requirements(target.folder)
        return target

    def _check_requirements(self, folder: Path) -> None:
        """A folder whose requirements this environment does not meet would start, answer ``/readyz``, then fail
        every verify with ``ModuleNotFoundError``: it is refused now, or served from a venv of its own."""
        from .._hosting._venvs import unmet_requirements

        unmet = unmet_requirements(folder)
        if not unmet:
            if self.config.venv:
                self.say(f"{folder.name}: its requirements.txt is met here; no venv of its own needed")
            return
        if not self.config.venv:
            raise ServeError(
                f"{folder.name}: its requirements.txt is not met here ({', '.join(unmet)}): serve it with "
                "gymhost serve --venv (a venv of its own, built once, as Gym builds one), or install them here "
                f"(gymhost requirements {folder} lists them for pip install -r)"
            )
        from .._hosting._venvs import folder_venv
        from .._nemo_gym import require_nemo_gym

        require_nemo_gym()  # its version is the venv's
        self._configure_logging()  # the build's warnings, said as serving will say them
        python = folder_venv(folder)
        arguments = [argument for argument in sys.argv[1:] if argument != "--venv"]
        # This command, from the folder's venv, with the secret settings this process took out of its environment.
        os.execve(python, [str(python), "-m", "gymhost", *arguments], {**os.environ, **secret_settings()})

    def _share(self, target: Target) -> Path | None:
        """Before anything imports prometheus_client's values: workers share their metrics (and sockets) through a
        folder, and so do a gateway's process mounts. The folder, if one is made: ``run`` removes it as it ends."""
        from .._metrics import share_metrics
        from ._workers import prepare_workers

        if self.config.workers > 1:
            return prepare_workers()
        if target.gateway and (self.config.venv or configured_sandbox() == "strict"):  # process mounts, maybe
            folder = scratch_folder("metrics")
            share_metrics(folder)
            return folder
        return None

    def _configure_logging(self) -> None:
        """``gymhost serve``'s logging (``--log-format``, ``--log-level``), once it is past the checks that end a
        start at once: not for ``load``, whose ASGI server configures its own."""
        from .._logging import logging_config

        logging.config.dictConfig(logging_config(self.config.log_format, self.config.log_level))

    def _bind(self) -> socket.socket:
        from ._run import bind_socket, bind_unix_socket, inherited_socket

        config = self.config
        if config.fd is not None:
            return inherited_socket(config.fd)
        if config.uds is not None:
            return bind_unix_socket(config.uds, config.backlog)
        return bind_socket(config.host, config.port, config.backlog)

    def _say_limits(self) -> None:
        """The open-files limit is raised to the hard limit (the instances inherit it), as Gym's launcher raises it.
        What limits a load, a hard limit too low for Gym's stated load or a listen queue the kernel caps, is said
        where a load can reach the server, beyond loopback, with the fix; on loopback it is only logged (debug)."""
        from ._accepting import backlog_warning, raise_open_files_limit
        from ._run import is_loopback

        said = [line for line in raise_open_files_limit() if line.startswith("WARNING")]
        capped = backlog_warning(self.config.backlog)
        reachable = self.config.uds is None and not is_loopback(self.config.host)
        for line in [*said, *([capped] if capped else [])]:
            if reachable:
                self.say(line)
            else:
                logger.debug("%s", line)

    # -- building and serving ----------------------------------------------------------------------------------------

    def _serve(self, target: Target, sock: socket.socket, workers_folder: Path | None) -> None:
        from ._run import held_collection, run_app, url_of
        from ._workers import serve_workers

        config = self.config
        self._configure_logging()  # what building the app logs (the env.yaml it read, say), as serving will say it
        # A written folder's hosted code starts as the app is built (``_early``); each worker's after its fork.
        early = target.folder if workers_folder is None else None
        try:
            if early is not None:
                from ..environments._early import start_early

                start_early(early, config_key=config.config_key, overrides=self._overrides())
            with held_collection():  # what the build makes frozen as it ends, before any worker is forked
                app = self._build(target, sock.getsockname()[:2] if config.uds is None else None)
            self._stop_if_signalled()
            self.say(f"serving {target.name} at {url_of(sock)}{self._mounts(target, app)}")
            self.say(self._secret)
            if workers_folder is not None:
                self.say(f"{config.workers} workers")
                serve_workers(app, sock, config, config.workers, workers_folder, run_app)
            else:
                run_app(app, sock, config)
        finally:
            if early is not None:
                from ..environments._early import stop_early

                stop_early()

    def _build(self, target: Target, address: tuple[str, int] | None) -> Any:
        """The app, built in the folder it serves, with this process's identity set: ``run``'s and ``load``'s."""
        from .._hosting._loading import enter_folder, load_app
        from .._nemo_gym import require_nemo_gym
        from .._sessions._identity import process_state
        from ._process_mount import serving_apart

        config = self.config
        require_nemo_gym()
        process_state.configure(
            replica=config.replica_id, port=address[1] if address else None, advertise_url=config.advertise_url
        )
        apart = serving_apart(config, config.server_urls, config.app.masked_verdicts, workers=config.workers)
        app = load_app(
            target.served,
            config.app,
            server_urls=config.server_urls,
            config_key=config.config_key,
            address=address,
            apart=apart,
            **self._overrides(),
        )
        if target.folder is not None:
            # As Gym's launcher runs a server: in its folder. Only now: env.yaml was looked for where the command ran.
            enter_folder(target.folder)
        if config.root_path:
            MOUNT.set(app, config.root_path)  # its metrics carry the prefix it is served under
        return app

    def _overrides(self) -> dict[str, Any]:
        """What the command line sets in the served block (``--set``, ``--name``)."""
        overrides: dict[str, Any] = dict(self.config.overrides)
        if self.config.name is not None:
            overrides["name"] = self.config.name
        return overrides

    @staticmethod
    def _mounts(target: Target, app: Any) -> str:
        if not target.gateway:
            return ""
        from starlette.routing import Mount

        return f" (servers: {', '.join(route.path for route in app.router.routes if isinstance(route, Mount))})"
