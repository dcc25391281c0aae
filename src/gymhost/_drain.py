"""The drain, in one place: how a gymhost process stops taking new episodes and waits for its open ones.

The first SIGTERM or SIGINT drains (``Drain.signalled`` decides, for uvicorn's and hypercorn's signal handling
alike): the process is marked draining, so every app's readiness says so (``_hosting._operating``, with
``NOT_READY``) and a seed is refused 503 (``DrainingMiddleware`` below, with ``REFUSAL``) while open episodes go on;
``wait`` returns once the process's open episodes have ended, or ``drain_timeout`` has passed, and the ASGI server
then shuts down gracefully. A second signal stops at once, and so does the first in a process whose parent has died
(a worker whose supervisor was killed): nobody is left to drain for, and the operator restarting the server wants
the port free. Each app registers what it counts as open (``count_open``); a worker also waits for its siblings'
episodes, whose requests it may be accepting and forwarding.

``DrainingMiddleware`` is the drain at an app's door: while the process drains, a seed (or a Gymnasium-style reset)
answers 503 with ``Retry-After`` and ``failure_kind: provider_unavailable``, so a load balancer or client takes the
episode elsewhere; open episodes go on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Collection
from typing import Any, Final

from starlette.types import ASGIApp, Receive, Scope, Send

from ._asgi import answer_json, path_below_mount
from ._metrics import open_episodes_of_all_workers
from ._nemo_gym import PROVIDER_UNAVAILABLE
from ._sessions._identity import process_state

__all__ = ["NOT_READY", "REFUSAL", "Drain", "DrainingMiddleware", "drain"]

logger = logging.getLogger("gymhost")

NOT_READY: Final = "draining: this process takes no new episodes and will exit when its open episodes end"
REFUSAL: Final[dict[str, Any]] = {
    "detail": "this server is draining (shutting down after its open episodes end): seed the episode elsewhere",
    "failure_kind": PROVIDER_UNAVAILABLE,
}
_POLL_S = 0.2


class Drain:
    def __init__(self) -> None:
        self.draining = False
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

    def open_episodes(self) -> int:
        """This process's open episodes; a worker's count includes its siblings' (their gauges, refreshed each
        second: ``_metrics``), so that no worker stops serving while the replica still has episodes."""
        with self._lock:
            counts = list(self._open.values())
        own = sum(count() for count in counts)
        return max(own, open_episodes_of_all_workers()) if process_state.workers_dir else own

    async def wait(self, timeout: float) -> None:
        """Take no new episodes, and wait until the open ones have ended or ``timeout`` has passed."""
        self.begin()
        if process_state.orphaned:
            logger.warning("the process that started this one is gone: stopping at once, without a drain")
            return
        open_now = self.open_episodes()
        if not open_now:
            logger.info("stopping: no episode is open")
            return
        logger.warning(
            "draining: no new episodes; waiting up to %gs for %d open episode(s) to end (a second signal stops at "
            "once)",
            timeout,
            open_now,
        )
        deadline = time.monotonic() + timeout
        while open_now and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)
            open_now = self.open_episodes()
        if open_now:
            logger.warning("drain timeout: %d episode(s) still open end masked as shutdown", open_now)
        else:
            logger.warning("drained: every open episode has ended")


drain = Drain()


class DrainingMiddleware:
    def __init__(self, app: ASGIApp, *, starts: Collection[str]) -> None:
        self.app = app
        self.starts = frozenset(starts)  # the POST paths that start an episode

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        http = scope["type"] == "http" and scope["method"] == "POST"
        if drain.draining and http and path_below_mount(scope) in self.starts:
            await answer_json(scope, receive, send, 503, REFUSAL, {"Retry-After": "5"})
            return
        await self.app(scope, receive, send)
