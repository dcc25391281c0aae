"""agent-env's own OpenEnv server for one bundle, run in agent-env's venv by gymhost (``_agent_env``).

    python _agent_env_app.py BUNDLE SOCKET SESSIONS

This file runs as a script in a venv with ``agentenv-framework[openenv]``, which is not gymhost's (agent-env's pins
conflict with nemo-gym's), so it imports only the standard library, agent-env and uvicorn. It serves
``agent_env.openenv.build_app(BUNDLE)`` on the Unix socket SOCKET, with ``max_concurrent_envs`` SESSIONS, from the
bundle's folder: agent-env reads its config (``.agentenv/config.toml``) from the working directory up, and a
bundle's config may name env types of its own, in modules beside its tasks.

It does not outlive the server that started it: it stops when its stdin closes (the server stopped it, or died by
any signal) and when the kernel says its parent died (``PR_SET_PDEATHSIG``), each time as on SIGTERM, which lets
agent-env tear its episodes down; past a grace period it exits regardless. A server that died cannot remove the
app's folder (the socket's, which also holds agent-env's stores): then the app removes it on its way out.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.abc
import importlib.machinery
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

_PR_SET_PDEATHSIG = 1
_GRACE_S = 10.0  # uvicorn's graceful shutdown (5 s) and agent-env's teardown of open episodes, then a hard exit


def main(argv: list[str]) -> None:
    if len(argv) != 3:
        raise SystemExit("usage: python _agent_env_app.py BUNDLE SOCKET SESSIONS")
    bundle, socket_path, sessions = Path(argv[0]).resolve(), argv[1], int(argv[2])
    _close_inherited()
    parent = int(os.environ.get("GYMHOST_PARENT_PID", "0"))
    folder = Path(socket_path).parent
    _stop_with_parent(parent, folder)
    os.chdir(bundle)
    sys.path.insert(0, str(bundle))
    _configure_logging()

    import uvicorn

    with _without_gradio():
        from agent_env.openenv import build_app

    app = build_app(bundle, max_concurrent_envs=sessions)
    # uvicorn shuts down on SIGTERM, then restores this handler and raises the signal again: the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        uvicorn.run(app, uds=socket_path, log_level="warning", timeout_graceful_shutdown=5)
    finally:
        _remove_if_orphaned(parent, folder)


def _close_inherited() -> None:
    """Hold the standard streams gymhost hands it and nothing else the server held: uvloop passes on every inheritable
    descriptor whatever ``close_fds`` says, among them what the server inherited from whoever started it. As
    ``gymhost._descriptors.close_inherited`` does for a template (this script cannot import gymhost)."""
    for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
        if fd > 2:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
                if os.get_inheritable(fd):
                    os.close(fd)


def _configure_logging() -> None:
    """agent-env's logs go to the server's stderr, one line each (FastMCP would install rich's handler at INFO). The
    a2a SDK warns on every episode that agent-env reads its proxy's card at the deprecated path: not the operator's.
    """
    logging.basicConfig(level=logging.WARNING, format="agent-env: %(levelname)s %(name)s: %(message)s")
    logging.getLogger("a2a.server.apps.jsonrpc.jsonrpc_app").setLevel(logging.ERROR)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_client_left_in_one_line)


def _client_left_in_one_line(record: logging.LogRecord) -> bool:
    """agent-env's A2A framework logs a traceback at ERROR when a request's client leaves before its body is read:
    its own client, inside the app, when a session closes while one of its calls is in flight (seen under load, as
    a test's episode ended). Said in one warning line instead: a traceback in the server's log means a fault."""
    error = record.exc_info[1] if record.exc_info else None
    if error is not None and type(error).__name__ == "ClientDisconnect":
        record.msg = f"{record.getMessage()}: the request's client left before its body was read"
        record.args, record.exc_info, record.exc_text = None, None, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
    return True


class _NoGradio(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "gradio" or fullname.startswith("gradio."):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


@contextlib.contextmanager
def _without_gradio() -> Iterator[None]:
    """agent-env's import as if gradio were not installed: OpenEnv's server package imports its web interface, and
    with it gradio (2.6 of the 4.6 s the import took here), and leaves the interface out when gradio is missing. It
    is only mounted with ``ENABLE_WEB_INTERFACE``, which this app never gets (its environment is an allow-list) and
    which on a Unix socket nobody could open. A bundle's own ``import gradio``, later, finds gradio as installed."""
    blocker = _NoGradio()
    sys.meta_path.insert(0, blocker)
    try:
        yield
    finally:
        sys.meta_path.remove(blocker)


def _remove_if_orphaned(parent: int, folder: Path) -> None:
    if os.getppid() != parent:
        shutil.rmtree(folder, ignore_errors=True)


def _stop_with_parent(parent: int, folder: Path) -> None:
    """SIGTERM when the parent dies (uvicorn then shuts down, and agent-env tears down its episodes), and when stdin
    ends, which it does when the parent closes it or dies; a hard exit a grace period after that."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if parent and os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)

    def watch() -> None:
        sys.stdin.buffer.read()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(_GRACE_S)
        _remove_if_orphaned(parent, folder)
        os._exit(1)

    threading.Thread(target=watch, name="gymhost-parent-watch", daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1:])
