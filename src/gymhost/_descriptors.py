"""No socket of the server's reaches a process its code starts; a process of hosted code that gymhost starts holds
its standard streams and what gymhost hands it, nothing else.

A descriptor marked inheritable reaches every process its holder starts through uvloop, whatever ``close_fds``
says (libuv has no such step; uvloop also leaves a copy of each standard stream it hands over), and every process
started by ``os.system``. Among a server's could be its listening socket (uvicorn and hypercorn make theirs
inheritable, for workers of their own) or a connection handed over between workers: hosted code holding one can
accept the trainer's requests, its own ``/verify`` among them, and answer them with any reward. So what gymhost
binds is not inheritable (``_serving._run.bind_socket``), nor what it receives from another process
(``received_fds``); building an app marks every socket the process already holds not inheritable
(``sockets_not_inherited``); and a template or instance closes what it was passed by mistake before the bundle's
code runs (``close_inherited``).
"""

from __future__ import annotations

import array
import contextlib
import os
import socket
import stat
from collections.abc import Collection

__all__ = ["close_inherited", "received_fds", "sockets_not_inherited"]


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


def received_fds(sock: socket.socket, bufsize: int, maxfds: int) -> tuple[bytes, list[int], int]:
    """``socket.recv_fds``, its descriptors not inheritable from the moment they exist (``MSG_CMSG_CLOEXEC``, which
    ``recv_fds`` does not pass on): no process started meanwhile, from another thread, receives one. The data, the
    descriptors and the message's flags."""
    fds = array.array("i")
    data, ancillary, flags, _ = sock.recvmsg(bufsize, socket.CMSG_LEN(maxfds * fds.itemsize), socket.MSG_CMSG_CLOEXEC)
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds), flags
