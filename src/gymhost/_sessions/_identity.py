"""Who this process is, whatever apps it serves: its replica id, its worker index among the replica's worker
processes, and this start of it; where its siblings are; and the gymhost process it dies with, if another started it.

A session is owned by the process that seeded it: its signed cookie and its MCP token carry the owner (``owner()``).
A request for a session another worker of this replica owns, or another replica that said where it listens
(``--advertise-url``), is forwarded there (``route()``, ``_forwarding``); one whose owner is gone (a replica with no
address, a worker or replica since restarted) is told its episode is lost instead of being served as a new one.

A process another gymhost process started (a worker, a gateway's process mount) dies with it (``follow_parent``): the
kernel sends it SIGTERM when its parent dies, and, its parent gone, it stops at once instead of draining for nobody
(``_drain``).
"""

from __future__ import annotations

import ctypes
import os
import secrets
import signal
import socket
from typing import Any

from .._config import configured_replica_id
from ._owner import Owner

__all__ = ["Owner", "ProcessState", "die_with_parent", "process_state"]

Target = tuple[str, str]  # ("worker", a sibling worker's Unix socket path) or ("replica", another replica's URL)
_PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int, parent: int) -> bool:
    """Have the kernel send this process ``signum`` when ``parent``, the process that started it, dies (Linux); False
    when it died already, before that took effect (this process has another parent by then)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum)
    return os.getppid() == parent


class ProcessState:
    def __init__(self) -> None:
        self.start = secrets.token_hex(4)  # differs between two starts of a replica with the same id
        self.replica = configured_replica_id() or f"{socket.gethostname()}:{os.getpid()}"
        self.worker = 0  # a worker's index among the replica's (``become_worker``)
        self.workers_dir: str | None = None  # where each worker listens: worker-<i>.forwards, worker-<i>.handoff
        self.advertise_url: str | None = None
        self.parent: int | None = None  # the gymhost process this one dies with, if another started it

    def follow_parent(self, parent: int) -> None:
        """Die with ``parent``, the process that started this one: SIGTERM when it dies (``PR_SET_PDEATHSIG``), and
        exit now if it is already gone."""
        self.parent = parent
        if not die_with_parent(signal.SIGTERM, parent):
            os._exit(1)

    @property
    def orphaned(self) -> bool:
        """Whether the process that started this one has died: nobody is left to drain for."""
        return self.parent is not None and os.getppid() != self.parent

    def configure(self, *, replica: str | None, port: int | None = None, advertise_url: str | None = None) -> None:
        """The replica id: given (``--replica-id``, ``GYMHOST_REPLICA_ID``), else this host and the port served; and
        the URL other replicas forward this one's sessions to, if it has one."""
        self.advertise_url = advertise_url.rstrip("/") if advertise_url else None
        if replica:
            self.replica = replica
        elif configured_replica_id():
            self.replica = str(configured_replica_id())
        elif port is not None:
            self.replica = f"{socket.gethostname()}:{port}"

    def become_worker(self, index: int, workers_dir: str) -> None:
        """In a worker process the supervisor just forked: an identity and a start of its own."""
        self.worker, self.workers_dir = index, workers_dir
        self.start = secrets.token_hex(4)

    def owner(self) -> Owner:
        owner: Owner = {"replica": self.replica, "worker": self.worker, "start": self.start}
        if self.advertise_url:
            owner["url"] = self.advertise_url
        return owner

    def describe(self, owner: Any) -> str:
        """Whose a session is, for a message: another replica, another worker, or an earlier start of either."""
        if not isinstance(owner, dict) or not owner.get("replica"):
            return "a process that did not say who it is (a session from before this server's version)"
        worker, start = owner.get("worker", 0), owner.get("start")
        if owner.get("replica") != self.replica:
            return f"replica {owner['replica']} (worker {worker}, start {start}), not this one ({self.replica})"
        if worker != self.worker:
            return f"worker {worker} of this replica ({self.replica}, start {start}), which is gone"
        return f"an earlier start of this replica ({self.replica}, worker {worker}, start {start}; now {self.start})"

    def is_mine(self, owner: Any) -> bool:
        return (
            isinstance(owner, dict)
            and owner.get("replica") == self.replica
            and owner.get("worker", 0) == self.worker
            and owner.get("start") == self.start
        )

    def sibling(self, owner: Any) -> int | None:
        """The index of the sibling worker of this replica ``owner`` names, if it names one (not this worker)."""
        if not isinstance(owner, dict) or owner.get("replica") != self.replica or self.workers_dir is None:
            return None
        worker = owner.get("worker", 0)
        return worker if isinstance(worker, int) and worker != self.worker else None

    def worker_socket(self, index: int, purpose: str) -> str:
        """Where worker ``index`` of this replica listens: ``forwards`` (requests, over HTTP) or ``handoff``
        (connections, ``_serving._handoff``)."""
        return os.path.join(self.workers_dir or "", f"worker-{index}.{purpose}")

    def route(self, owner: Any) -> Target | None:
        """Where a session that is not this process's lives, if this process can reach it: a sibling worker's
        socket, or the URL another replica advertised. None: its owner is gone, or never said where it is."""
        if not isinstance(owner, dict) or not owner.get("replica"):
            return None
        if owner["replica"] == self.replica:
            worker = self.sibling(owner)
            # None: this worker, restarted since: the session is lost
            return None if worker is None else ("worker", self.worker_socket(worker, "forwards"))
        url = owner.get("url")
        return ("replica", str(url)) if isinstance(url, str) and url.startswith(("http://", "https://")) else None


process_state = ProcessState()
