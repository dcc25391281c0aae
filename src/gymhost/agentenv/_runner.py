"""Serve one instance of a bundle's environment on loopback: ``python -m gymhost.agentenv._runner BUNDLE``.

The pool starts one of these per instance. The runner binds 127.0.0.1 port 0 itself and prints
``gymhost-env-ready <port>`` as the only line on its stdout, so the parent learns the port without the race of
picking a "free" port for someone else to bind. Everything else the environment prints goes to stderr.

It exits when its stdin reaches end of file. The parent holds the other end and never writes, so when the parent
dies, by any signal, the instance follows: no environment process outlives the server that started it.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from pathlib import Path

from ._exceptions import StartupError
from ._launchers import READY, load_environment_class
from ._schema_cache import install as install_schema_cache


def _exit_when_parent_goes() -> None:
    try:
        while sys.stdin.buffer.read(65536):
            pass
    finally:
        os._exit(0)


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m gymhost.agentenv._runner BUNDLE_FOLDER")
    threading.Thread(target=_exit_when_parent_goes, name="parent-watch", daemon=True).start()
    # The pipe to the parent carries one line, READY <port>; whatever the environment prints goes to stderr.
    ready = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    # FastMCP configures INFO logging of every MCP request unless logging is configured first.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    import uvicorn

    try:
        environment = load_environment_class(Path(argv[0]).resolve())()
    except StartupError as error:
        raise SystemExit(str(error)) from None
    install_schema_cache()  # an instance process validates its tools' results as an in-process instance does
    app = environment.create_app().streamable_http_app()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    ready.write(f"{READY} {sock.getsockname()[1]}\n")
    ready.close()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
    server.run(sockets=[sock])


if __name__ == "__main__":
    main(sys.argv[1:])
