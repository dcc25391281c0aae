"""What is true of the whole process, whatever apps it serves: who it is (its replica id and this start of it), and
whether it is draining.

A session is owned by the process that seeded it: its signed cookie and its MCP token carry the owner (``owner()``),
so a request that reaches another replica, or this replica after a restart, is told its episode is lost instead of
being served as a new one. Draining is process-wide too: a SIGTERM stops every app in the process from taking new
episodes, and the server exits once the apps' open episodes have ended (``open_episodes()``).
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ._config import REPLICA_ENV_VAR

__all__ = ["Owner", "ProcessState", "process_state"]

Owner = dict[str, str]  # {"replica": id, "start": this start's nonce}: stamped into sessions and MCP tokens


class ProcessState:
    def __init__(self) -> None:
        self.start = secrets.token_hex(4)  # differs between two starts of a replica with the same id
        self.started_at = time.time()
        self.replica = os.environ.get(REPLICA_ENV_VAR) or f"{socket.gethostname()}:{os.getpid()}"
        self.draining = False
        self.drain_started_at: float | None = None
        self._open: dict[int, Callable[[], int]] = {}
        self._lock = threading.Lock()

    def configure(self, *, replica: str | None, port: int | None = None) -> None:
        """The replica id: given (``--replica-id``, ``GYMHOST_REPLICA_ID``), else this host and the port served."""
        if replica:
            self.replica = replica
        elif os.environ.get(REPLICA_ENV_VAR):
            self.replica = os.environ[REPLICA_ENV_VAR]
        elif port is not None:
            self.replica = f"{socket.gethostname()}:{port}"

    def owner(self) -> Owner:
        return {"replica": self.replica, "start": self.start}

    def describe(self, owner: Any) -> str:
        """Whose a session is, for a message: another replica, or an earlier start of this one."""
        if not isinstance(owner, dict) or not owner.get("replica"):
            return "a process that did not say who it is (a session from before this server's version)"
        if owner.get("replica") == self.replica:
            return f"an earlier start of this replica ({self.replica}, start {owner.get('start')}; now {self.start})"
        return f"replica {owner.get('replica')} (start {owner.get('start')}), not this one ({self.replica})"

    def is_mine(self, owner: Any) -> bool:
        return isinstance(owner, dict) and owner.get("replica") == self.replica and owner.get("start") == self.start

    # -- draining ---------------------------------------------------------------------------------------------

    def begin_drain(self) -> None:
        with self._lock:
            if not self.draining:
                self.draining, self.drain_started_at = True, time.monotonic()

    def end_drain(self) -> None:
        """For tests that drain a process they keep using."""
        with self._lock:
            self.draining, self.drain_started_at = False, None

    def count_open(self, key: int, count: Callable[[], int]) -> Callable[[], None]:
        """Register a source of open episodes (an app's); the returned callable unregisters it."""
        with self._lock:
            self._open[key] = count

        def forget() -> None:
            with self._lock:
                self._open.pop(key, None)

        return forget

    def open_episodes(self) -> int:
        with self._lock:
            counts = list(self._open.values())
        return sum(count() for count in counts)


process_state = ProcessState()
