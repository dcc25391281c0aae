"""The drain, in one place: how a gymhost process stops taking new episodes and waits for its open ones.

The first SIGTERM or SIGINT drains (``Drain.signalled`` decides, for uvicorn's and hypercorn's signal handling
alike): the process is marked draining, so every app's readiness says so (``_hosting._operating``, with
``NOT_READY``) and a seed is refused 503 (``DrainingMiddleware`` below, with ``REFUSAL``) while open episodes go on;
``wait`` returns once the process's open episodes have ended, or ``drain_timeout`` has passed, and the ASGI server
then shuts down gracefully. A second signal stops at once, and so does the first in a process whose parent has died
(a worker whose supervisor was killed): nobody is left to drain for, and the operator restarting the server wants
the port free. Each app registers what it counts as open (``count_open``).

A worker of ``--workers N`` also waits for its siblings' episodes, whose requests it may be accepting and forwarding
(``WorkerCounts``): the supervisor marks the replica draining before it signals the workers; each worker, once its
drain begins, says how many episodes it holds, at once and again at every poll; and none concludes that nothing is
open until every live sibling has said a count of its own drain. A sibling's count is never read from an older
moment (the gauges each worker refreshes every second were such a moment: a signal within that second let a worker
holding none of the episodes stop at once). A sibling that dies says nothing more: the supervisor says it for it.

``DrainingMiddleware`` is the drain at an app's door: while the process drains, a seed (or a Gymnasium-style reset)
answers 503 with ``Retry-After`` and ``failure_kind: provider_unavailable``, so a load balancer or client takes the
episode elsewhere; open episodes go on. A seed that came in before the drain began and is still being answered (an
instance starting for it) counts as open until it is answered: its episode is about to be, and a drain that
stopped then would answer the seed and lose the episode it started.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, Final

from starlette.types import ASGIApp, Receive, Scope, Send

from ._asgi import answer_json, path_below_mount
from ._nemo_gym import PROVIDER_UNAVAILABLE
from ._sessions._identity import process_state

__all__ = ["NOT_READY", "REFUSAL", "Drain", "DrainingMiddleware", "WorkerCounts", "drain"]

logger = logging.getLogger("gymhost")

NOT_READY: Final = "draining: this process takes no new episodes and will exit when its open episodes end"
REFUSAL: Final[dict[str, Any]] = {
    "detail": "this server is draining (shutting down after its open episodes end): seed the episode elsewhere",
    "failure_kind": PROVIDER_UNAVAILABLE,
}
_POLL_S = 0.2
_SIBLINGS_POLL_S = 0.02  # until every sibling has said its count: moments after the signal, which reaches them all


class WorkerCounts:
    """What the workers of one replica tell each other as they drain, in the folder they share (``_workers``):

    - ``draining``: the supervisor's mark, made before it signals the workers: the whole replica drains. A worker
      signalled alone (an operator's ``kill`` of one worker, which the supervisor then restarts) waits for its own
      episodes only: its siblings go on serving theirs.
    - ``worker-<i>.open``: worker ``i``'s count, one line: empty from its start until its drain begins (it has said
      nothing yet), then its open episodes, said at once and again at every poll; ``gone`` once the supervisor has
      seen it exit (it holds nothing any more, whatever it said last).
    """

    _MARK = "draining"
    _GONE = "gone"

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    # -- the supervisor's ------------------------------------------------------------------------------------------

    def started(self, index: int) -> None:
        """Before worker ``index`` is started: it is a sibling, which has said nothing yet."""
        self._write(index, "")

    def gone(self, index: int) -> None:
        """Worker ``index`` has exited: its episodes are over (ended, or lost with it)."""
        self._write(index, self._GONE)

    def mark_draining(self) -> None:
        """The replica drains: said before any worker is signalled, so that each reads it when its signal comes."""
        (self.folder / self._MARK).touch()

    # -- a worker's ------------------------------------------------------------------------------------------------

    def replica_draining(self) -> bool:
        return (self.folder / self._MARK).exists()

    def say(self, index: int, count: int) -> None:
        """Worker ``index`` holds ``count`` open episodes, counted now, during its drain."""
        self._write(index, str(count))

    def siblings_open(self, index: int) -> int | None:
        """The episodes open in worker ``index``'s siblings, each as it last said during its drain; None while a
        live sibling has not said any yet."""
        total = 0
        for path in self.folder.glob("worker-*.open"):
            if path.name == self._name(index):
                continue
            try:
                said = path.read_text().strip()
            except FileNotFoundError:  # replaced at this moment: read again at the next poll
                return None
            if said == self._GONE:
                continue
            if not said.isdigit():
                return None
            total += int(said)
        return total

    def _name(self, index: int) -> str:
        return f"worker-{index}.open"

    def _write(self, index: int, text: str) -> None:
        """Whole or not at all: a reader never sees half a count."""
        path = self.folder / self._name(index)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(text)
        os.replace(partial, path)


class Drain:
    def __init__(self) -> None:
        self.draining = False
        self.seeding = 0  # seeds being answered now (``DrainingMiddleware``): each will be an open episode
        self._signals = 0
        self._open: dict[int, Callable[[], int]] = {}
        self._lock = threading.Lock()

    def signalled(self) -> bool:
        """A stop signal arrived: whether to drain (the first, with someone to drain for) rather than stop now."""
        self._signals += 1
        return self._signals == 1 and not process_state.orphaned

    def begin(self) -> None:
        self.draining = True

    def count_open(self, key: int, count: Callable[[], int]) -> Callable[[], None]:
        """Register a source of open episodes (an app's); the returned callable unregisters it."""
        with self._lock:
            self._open[key] = count

        def forget() -> None:
            with self._lock:
                self._open.pop(key, None)

        return forget

    def own_episodes(self) -> int:
        """The episodes open in this process's apps, and those whose seeds are being answered."""
        with self._lock:
            counts = list(self._open.values())
        return self.seeding + sum(count() for count in counts)

    def _open_episodes(self, siblings: WorkerCounts | None) -> int | None:
        """The episodes to wait for: this process's, said to its siblings (a worker's), and, when the whole replica
        drains, theirs; None while a sibling has not said its count yet."""
        own = self.own_episodes()
        if siblings is None:
            return own
        siblings.say(process_state.worker, own)
        others = siblings.siblings_open(process_state.worker)
        return None if others is None else own + others

    async def wait(self, timeout: float) -> None:
        """Take no new episodes, and wait until the open ones have ended or ``timeout`` has passed."""
        self.begin()
        if process_state.orphaned:
            logger.warning("the process that started this one is gone: stopping at once, without a drain")
            return
        deadline = time.monotonic() + timeout
        siblings = WorkerCounts(process_state.workers_dir) if process_state.workers_dir else None
        if siblings is not None and not siblings.replica_draining():
            siblings = None  # signalled alone: the siblings go on serving their own episodes
        open_now = self._open_episodes(siblings)
        while open_now is None and time.monotonic() < deadline:
            await asyncio.sleep(_SIBLINGS_POLL_S)
            open_now = self._open_episodes(siblings)
        if open_now == 0:
            logger.info("stopping: no episode is open")
            return
        logger.warning(
            "draining: no new episodes; waiting up to %gs for %s open episode(s) to end (a second signal stops at "
            "once)",
            timeout,
            "the workers'" if open_now is None else open_now,
        )
        while open_now != 0 and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)
            open_now = self._open_episodes(siblings)
        if open_now is None:
            logger.warning("drain timeout: a worker never said how many episodes it holds; stopping")
        elif open_now:
            logger.warning("drain timeout: %d episode(s) still open end masked as shutdown", open_now)
        else:
            logger.warning("drained: every open episode has ended")


drain = Drain()


class DrainingMiddleware:
    def __init__(self, app: ASGIApp, *, starts: Collection[str]) -> None:
        self.app = app
        self.starts = frozenset(starts)  # the POST paths that start an episode

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        seed = scope["type"] == "http" and scope["method"] == "POST" and path_below_mount(scope) in self.starts
        if not seed:
            await self.app(scope, receive, send)
        elif drain.draining:
            await answer_json(scope, receive, send, 503, REFUSAL, {"Retry-After": "5"})
        else:
            drain.seeding += 1
            try:
                await self.app(scope, receive, send)
            finally:
                drain.seeding -= 1
