"""A Gym server's own process, confined (``gymhost serve FOLDER --sandbox strict``): the server runs in a sandbox as
a process instance does, since the code it hosts runs the model's text (``code_gen``'s verify, "no sandbox").

A written folder's hosted code is its instances, each confined where it begins; a Gym server's is the server itself
and the children it starts. So under ``strict`` a server whose folders are all Gym's runs, workers and all, inside
the same sandbox as an instance (``_confinement``'s, at the strict level): the root file system, its folders
included, read-only; a private ``/tmp`` of bounded size; no network but its listening socket, unless a folder calls
other servers (a judge: ``referenced_servers``) or ``--network`` says so; no view of the host's processes; as an
unprivileged user, not dumpable, so the children it starts on the model's text, that same user, can neither read
its memory nor its environment (``_rules.enter_server``). A gateway that also serves written folders serves each
of its Gym folders this way in a process of its own (``_process_mount``), since a template cannot confine its
instances from inside a sandbox (the kernel refuses it a ``/proc``).

Two processes, because bubblewrap passes no signal on to what it runs: the one ``gymhost serve`` started as stays
outside as the supervisor. It binds the socket (a busy port is still one line), starts the sandbox with the socket,
the config and its secrets handed in (``python -m gymhost._serving._confined``: a pipe, read once), passes SIGTERM
and SIGINT on to the server inside (a drain, as unconfined), and exits as it exits. The sandbox dies with it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

from .._config import SECRET_ENV_VAR, ServeConfig, configured_network, configured_sandbox, secret_settings
from .._hosting._folder import declared_datasets, find_env_yaml, load_server_spec, referenced_servers
from .._hosting._targets import Target
from .._metrics import (
    METRICS_FOLDER_ENV_VAR,
    confined_metrics_folder,
    own_folder_is_hosted,
    release_confined_metrics_folder,
    shared_metrics_folder,
)

__all__ = ["ConfinedServer", "confined_server", "exit_as", "inside", "serve_confined"]

logger = logging.getLogger("gymhost")

# This process is a confined server already (``main``): it confines nothing again.
inside = False


@dataclass(frozen=True)
class ConfinedServer:
    """What a confined server may reach: its folders (and the ``env.yaml`` files they read) and, if ``network``,
    the network; ``why_network``: who asked for it, for the start line."""

    folders: tuple[Path, ...]
    network: bool
    why_network: str


def confined_server(target: Target, config: ServeConfig) -> ConfinedServer | None:
    """The confinement of this server's own process, when it needs one: ``--sandbox strict`` (the operator's
    choice; a Gym folder has no setting of its own) and every folder a Gym server's, none needing a process of its
    own. None otherwise: written folders confine their instances, and a gateway mixing both its Gym folders apart."""
    from .._hosting._venvs import unmet_requirements

    if inside or configured_sandbox() != "strict":
        return None
    folders = target.folders()
    specs = {folder: load_server_spec(folder, config_key=config.config_key) for folder in folders.values()}
    if any(spec.written for spec in specs.values()):
        return None
    if target.gateway and config.venv and any(unmet_requirements(folder) for folder in folders.values()):
        return None  # those are served apart, each confined in its own process
    callers = sorted(spec.folder.name for spec in specs.values() if referenced_servers(spec.block))
    if configured_network():
        why = "--network"
    elif callers:
        why = f"{', '.join(callers)} call{'s' if len(callers) == 1 else ''} other servers"
    else:
        why = ""
    return ConfinedServer(tuple(folders.values()), bool(why), why)


def serve_confined(
    config: ServeConfig, sock: socket.socket, confined: ConfinedServer, secret_line: str, say: Callable[[str], None]
) -> int:
    """Run the server in its sandbox on ``sock``, passing signals on; its exit status (bubblewrap's: 128 + N for a
    server that died by signal N). Raises ``ConfinementError`` where no sandbox can be made (strict's refusal)."""
    from .._confinement import Limits, confinement
    from .._sessions._signing import process_secret

    chosen = confinement("strict")
    rules = chosen.rules(hidden=(), limits=Limits(), network=confined.network)
    readable = [*confined.folders, *{found for f in confined.folders if (found := find_env_yaml(f)) is not None}]
    # The rows with their answers (code_gen's hidden tests): the model's code its verify runs would print them back.
    rows = [path for folder in confined.folders for path in declared_datasets(folder)]
    # The secrets travel in the pipe, with the config: an environment would stay in the sandbox's first process,
    # readable by the code the server runs where bubblewrap makes a user namespace (a server that is not root).
    secrets = {**secret_settings(), SECRET_ENV_VAR: process_secret()}
    environment = {**os.environ, **chosen.environment()}  # os.environ holds no secret: taken at start
    shared = shared_metrics_folder()  # a gateway's, for its process mount: a folder of its own there, and no more
    made = confined_metrics_folder(shared, config.root_path) if shared is not None else None
    own = chosen.hand_over(made) if made is not None else None
    if own is not None:
        environment[METRICS_FOLDER_ENV_VAR] = str(own)
    read, write = os.pipe()
    command = chosen.command(
        [sys.executable, "-m", "gymhost._serving._confined", str(read)],
        readable=readable,
        writable=[own] if own is not None else [],
        network=confined.network,
        workdir=Path.cwd(),  # where relative paths and Gym's env.yaml are looked for, as unconfined
        unreadable=rows,
    )
    network = f"the network ({confined.why_network})" if confined.network else "no network"
    hidden = ""
    if rows:
        hidden = f"; its dataset rows out of sight ({len(rows)} file{'s' * (len(rows) != 1)} its configs declare)"
    say(f"its own code runs confined: {chosen.description}; its folders read-only, a private /tmp, {network}{hidden}")
    supervisor = _Supervisor()
    try:
        with supervisor.passing_signals():  # from before the sandbox starts: a SIGTERM meanwhile is not lost
            supervisor.start(
                command,
                pass_fds=(sock.fileno(), read),
                env=environment,
                start_new_session=True,
                preexec_fn=functools.partial(_die_with, os.getpid()),
            )
            os.close(read)
            with os.fdopen(write, "wb") as pipe:
                pickle.dump((replace(config, fd=sock.fileno()), rules, secret_line, secrets), pipe)
            return supervisor.wait()
    finally:
        if made is not None:
            release_confined_metrics_folder(made)


def _die_with(supervisor: int) -> None:
    """In the sandbox's first process, before bubblewrap runs: SIGKILL when the supervisor dies, however it dies;
    bubblewrap's own ``--die-with-parent`` takes the sandbox with it."""
    from .._sessions._identity import die_with_parent

    if not die_with_parent(signal.SIGKILL, supervisor):
        os._exit(1)


class _Supervisor:
    """The sandbox's process, and SIGTERM and SIGINT passed on to the server inside it (the sandbox has a session
    of its own: a terminal's Ctrl-C reaches only this process)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.pending: int | None = None  # a signal that came before the sandbox did

    @contextlib.contextmanager
    def passing_signals(self) -> Iterator[None]:
        previous = {signum: signal.signal(signum, self._pass_on) for signum in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def start(self, command: list[str], **options: Any) -> None:
        self.process = subprocess.Popen(command, **options)

    def wait(self) -> int:
        assert self.process is not None
        if self.pending is not None:  # stopped before it began: nothing to drain
            self.process.kill()
        return self.process.wait()

    def _pass_on(self, signum: int, frame: Any) -> None:
        if self.process is None:
            self.pending = signum
            return
        server = _server_in(self.process.pid)
        if server is None:  # not started yet, or gone: nothing to drain
            self.process.kill()
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signum)


def _server_in(sandbox: int) -> int | None:
    """The server's process: the child of the sandbox's first process in its PID namespace (bubblewrap's init),
    itself bubblewrap's child."""
    for _level in range(2):
        found = _children(sandbox)
        if not found:
            return None
        sandbox = found[0]
    return sandbox


def _children(pid: int) -> list[int]:
    """``pid``'s children: the kernel's list of them where it keeps one (``CONFIG_PROC_CHILDREN``), else every
    process whose parent it is."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            return [int(child) for child in children.read().split()]
    except FileNotFoundError:
        pass
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return found


def exit_as(status: int) -> NoReturn:
    """End this process as the server in the sandbox ended: by the same signal (its exit status says so to whoever
    waits on it; bubblewrap's status is 128 + N for a server that died by signal N, and -N is bubblewrap killed),
    else with its status."""
    signum = -status if status < 0 else status - 128 if status > 128 else 0
    if signum:
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)
    raise SystemExit(status if status > 0 else 1)


def main(argv: Sequence[str]) -> None:
    """Inside the sandbox: confine this process, then serve."""
    global inside
    from .._config import hand_secrets, take_secrets
    from .._confinement import enter_server
    from .._exceptions import GymhostError
    from .._logging import error_line
    from ._server import Server

    with os.fdopen(int(argv[0]), "rb") as pipe:
        config, rules, secret_line, secrets = pickle.load(pipe)
    enter_server(rules)
    take_secrets()  # none in the environment: read once, as every gymhost process does
    hand_secrets(secrets)
    inside = True
    own_folder_is_hosted()
    server = Server(config)
    server._secret = secret_line  # the supervisor's words: where the secret is kept is out of sight in here
    try:
        server.run()
    except GymhostError as error:  # said as gymhost serve says its errors, not as a traceback; the supervisor exits so
        print(error_line(str(error), config.log_format), file=sys.stderr, flush=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    from gymhost._serving._confined import main as confined_main  # this module's own globals, not __main__'s

    confined_main(sys.argv[1:])
