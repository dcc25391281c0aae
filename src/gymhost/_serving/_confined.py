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
the config and its secret handed in (``python -m gymhost._serving._confined``: a pipe, read once), passes SIGTERM
and SIGINT on to the server inside (a drain, as unconfined), and exits as it exits. The sandbox dies with it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

from .._config import SECRET_ENV_VAR, ServeConfig, configured_network, configured_sandbox, secret_settings
from .._hosting._folder import find_env_yaml, load_server_spec, referenced_servers
from .._hosting._targets import Target
from .._metrics import METRICS_FOLDER_ENV_VAR, shared_metrics_folder

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
    if any(written(spec.block) for spec in specs.values()):
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


def written(block: dict[str, Any]) -> bool:
    """Whether a resources-server block is one ``gymhost write`` made (its hosted code is its instances)."""
    source = block.get("source")
    return isinstance(source, dict) and "kind" in source


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
    # The secret travels as for a venv's exec: in the environment, taken out of it at the server's start.
    environment = {**os.environ, **secret_settings(), SECRET_ENV_VAR: process_secret(), **chosen.environment()}
    shared = shared_metrics_folder()  # a gateway's, for its process mount: a folder of its own there, and no more
    made = Path(tempfile.mkdtemp(prefix="confined-", dir=shared)) if shared is not None else None
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
    )
    network = f"the network ({confined.why_network})" if confined.network else "no network"
    say(f"its own code runs confined: {chosen.description}; its folders read-only, a private /tmp, {network}")
    try:
        process = subprocess.Popen(
            command,
            pass_fds=(sock.fileno(), read),
            env=environment,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        os.close(read)
        with os.fdopen(write, "wb") as pipe:
            pickle.dump((replace(config, fd=sock.fileno()), rules, secret_line), pipe)
        return _supervise(process)
    finally:
        if made is not None:  # its values, whose process is gone, leave the gateway's sums with it
            shutil.rmtree(made, ignore_errors=True)


def _die_with_parent() -> None:
    """In the sandbox's first process, before bubblewrap runs: SIGKILL when the supervisor dies, however it dies;
    bubblewrap's own ``--die-with-parent`` takes the sandbox with it."""
    from .._sessions._identity import die_with_parent

    if not die_with_parent(signal.SIGKILL, os.getppid()):
        os._exit(1)


def _supervise(process: subprocess.Popen[bytes]) -> int:
    """Wait for the sandbox, passing each SIGTERM and SIGINT on to the server inside it (the sandbox has a session
    of its own: a terminal's Ctrl-C reaches only this process)."""

    def pass_on(signum: int, frame: Any) -> None:
        server = _server_in(process.pid)
        if server is None:  # not started yet, or gone: nothing to drain
            process.kill()
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signum)

    previous = {signum: signal.signal(signum, pass_on) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        return process.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _server_in(sandbox: int) -> int | None:
    """The server's process: the child of the sandbox's first process in its PID namespace (bubblewrap's init),
    itself bubblewrap's child."""
    for _level in range(2):
        try:
            with open(f"/proc/{sandbox}/task/{sandbox}/children") as children:
                found = children.read().split()
        except OSError:
            return None
        if not found:
            return None
        sandbox = int(found[0])
    return sandbox


def exit_as(status: int) -> NoReturn:
    """End this process as the server in the sandbox ended: by the same signal (its exit status says so to whoever
    waits on it), else with its status."""
    if status > 128 and status - 128 in (signal.SIGTERM, signal.SIGINT):
        signal.signal(status - 128, signal.SIG_DFL)
        signal.raise_signal(status - 128)
    raise SystemExit(status)


def main(argv: Sequence[str]) -> None:
    """Inside the sandbox: confine this process, then serve."""
    global inside
    from .._config import take_secrets
    from .._confinement import enter_server
    from ._server import Server

    with os.fdopen(int(argv[0]), "rb") as pipe:
        config, rules, secret_line = pickle.load(pipe)
    enter_server(rules)
    take_secrets()  # the secret, handed in the environment: gone from it before any server code is imported
    inside = True
    server = Server(config)
    server._secret = secret_line  # the supervisor's words: where the secret is kept is out of sight in here
    server.run()


if __name__ == "__main__":
    from gymhost._serving._confined import main as confined_main  # this module's own globals, not __main__'s

    confined_main(sys.argv[1:])
