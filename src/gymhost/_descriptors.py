"""The file descriptors a process of hosted code starts with: its standard streams and what gymhost hands it.

A descriptor marked inheritable reaches every process its holder starts through uvloop, whatever ``close_fds``
says (libuv has no such step; uvloop also leaves a copy of each standard stream it hands over), and every process
started by ``os.system``. Among a server's could be its listening socket (uvicorn and hypercorn make theirs
inheritable, for workers of their own) or a connection handed over between workers: hosted code holding one can
accept the trainer's requests, its own ``/verify`` among them, and answer them with any reward. So the app keeps the
process's sockets to itself before a folder's code is imported (``sockets_not_inherited``), and
a process of hosted code that gymhost starts closes what it was passed by mistake before the code runs
(``close_inherited``). What gymhost binds or receives itself is never inheritable (``_serving._run.bind_socket``,
``_serving._handoff``).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Collection

__all__ = ["close_inherited", "sockets_not_inherited"]


def _descriptors() -> list[int]:
    return [int(name) for name in os.listdir("/proc/self/fd")]


def close_inherited(keep: Collection[int] = ()) -> None:
    """Close every inheritable descriptor of this process but its standard streams and ``keep``. What Python itself
    opened here is not inheritable, and stays."""
    for fd in _descriptors():
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
                if os.get_inheritable(fd):
                    os.close(fd)


def sockets_not_inherited() -> None:
    """Mark every socket of this process not inheritable, whoever made it so: the ASGI server that runs the app
    keeps serving on its sockets (hypercorn's are bound but not yet listening when the app is built, so every
    socket, not only listening ones), and no process the app's code starts receives them."""
    for fd in _descriptors():
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            if os.get_inheritable(fd) and stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.set_inheritable(fd, False)
