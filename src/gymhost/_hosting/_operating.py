"""What an operator sees of an app and how it is moved: readiness, metrics, and the episodes a drain waits for.

``operate(app, server)`` gives an app built by ``create_app``:

- ``GET /``, ``/health``, ``/healthz``, ``/livez`` (``LIVENESS_ROUTES``): liveness, ``{"status": "ok"}`` whenever the
  process answers. They are gymhost's own, in place of Gym's, so every nemo-gym version answers all four (0.4.0 has
  ``/`` alone), and no route of the server's shadows them (a written server's ``POST /{name}`` made them 405). A
  server's POST route at one of those paths (a tool named ``health``) is kept: it answers its POSTs as before.
- ``GET /readyz``: 200 only once the app's lifespan has started, the server says it is ready (a written server: its
  pool has its minimum of instances serving) and the process is not draining; otherwise 503 with a JSON ``reason``.
  It replaces Gym's, which answers ok whatever the state.
- ``GET /metrics``: the Prometheus exposition of the app's series (its mount's) and the process's (``_metrics``).
- episode metrics and the open-episode count a drain waits for: a written server keeps its own (it has the methods
  of ``EpisodeSource``); any other server's sessions are followed from outside (``middleware.tracking``).
- its gauges refreshed every second while it runs (a worker's /metrics adds its siblings' up) and at every scrape.

Under a gateway, the gateway says where each app is mounted before their lifespans start, so their series carry
that mount, and the gateway's own ``/readyz`` and ``/metrics`` cover every mount.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from .._drain import NOT_READY, drain
from .._keys import MOUNT, MOUNTS, StateKey
from .._metrics import CONTENT_TYPE, EpisodeMetrics, render
from .._nemo_gym import LIVENESS_ROUTES, READINESS_ROUTE
from ..middleware.tracking import SessionTracker
from ._lifespan import on_lifespan, wrap_lifespan

__all__ = ["EpisodeSource", "Operated", "Operations", "add_operating_routes", "operate"]

_GAUGE_EVERY_S = 1.0


class Operated(Protocol):
    """What a gateway's readiness and ``/metrics`` read of each mount (``Operations``, or a process mount's)."""

    @property
    def mount(self) -> str: ...
    def not_ready(self) -> str | None: ...
    def open_episodes(self) -> int: ...


OPERATIONS: StateKey[Operated] = StateKey("gymhost_operations")  # readiness, metrics, open episodes


class EpisodeSource(Protocol):
    """A server that keeps its own episodes (``WrittenResourcesServer``)."""

    def gymhost_bind_metrics(self, metrics: EpisodeMetrics) -> None: ...
    def gymhost_open_episodes(self) -> int: ...
    def gymhost_not_ready(self) -> str | None: ...
    def gymhost_gauges(self) -> dict[str, Any]: ...


@dataclass
class Operations:
    """One app's operating state (``OPERATIONS``)."""

    metrics: EpisodeMetrics
    source: EpisodeSource | None
    tracker: SessionTracker | None
    started: bool = False
    forget: list[Callable[[], None]] = field(default_factory=list)

    @property
    def mount(self) -> str:
        return self.metrics.mount

    def open_episodes(self) -> int:
        if self.source is not None:
            return self.source.gymhost_open_episodes()
        return self.tracker.open_count() if self.tracker is not None else 0

    def not_ready(self) -> str | None:
        if not self.started:
            return (
                "starting: the app's lifespan has not finished starting (mounted in an app of yours? that app runs "
                "its mounts' lifespans with lifespan=gymhost.mounted_lifespan)"
            )
        if drain.draining:
            return NOT_READY
        return self.source.gymhost_not_ready() if self.source is not None else None

    def refresh_gauges(self) -> None:
        if self.source is not None:
            self.metrics.gauges(**self.source.gymhost_gauges())
        else:
            self.metrics.gauges(open_episodes=self.open_episodes())


def operate(app: Any, server: Any) -> Operations:
    source: EpisodeSource | None = server if hasattr(server, "gymhost_open_episodes") else None
    operations = Operations(EpisodeMetrics(), source, None if source is not None else SessionTracker())
    if source is not None:
        source.gymhost_bind_metrics(operations.metrics)
    OPERATIONS.set(app, operations)

    @asynccontextmanager
    async def bound(app_: Any) -> AsyncIterator[None]:
        operations.metrics.bind(MOUNT.get(app_) or "/")  # before the server's own lifespan runs
        yield

    def started(app_: Any) -> None:
        operations.started = True
        operations.forget.append(drain.count_open(id(operations), operations.open_episodes))
        task = asyncio.get_running_loop().create_task(_refresh(operations), name="gymhost-gauges")

        def cancel() -> None:
            task.cancel()

        operations.forget.append(cancel)

    def stopping(app_: Any) -> None:
        operations.started = False
        while operations.forget:
            operations.forget.pop()()

    on_lifespan(app, started, stopping)
    wrap_lifespan(app, bound)
    add_operating_routes(app, liveness=LIVENESS_ROUTES)
    return operations


def add_operating_routes(app: Any, *, liveness: Collection[str] = ()) -> None:
    """Liveness at each path of ``liveness``, ``/readyz`` and ``/metrics``, ahead of every other route. Whatever
    answered a GET at those paths before (Gym's liveness and readiness) is dropped; routes of other methods there
    stay, and answer as before."""
    ours = {*liveness, READINESS_ROUTE, "/metrics"}
    app.router.routes[:] = [route for route in app.router.routes if not _answers_get_at(route, ours)]
    app.router.routes[:0] = [
        *(Route(path, liveness_endpoint, methods=["GET", "HEAD"], include_in_schema=False) for path in liveness),
        Route(READINESS_ROUTE, readiness_endpoint, methods=["GET", "HEAD"], include_in_schema=False),
        Route("/metrics", metrics_endpoint, methods=["GET"], include_in_schema=False),
    ]


def _answers_get_at(route: BaseRoute, paths: Collection[str]) -> bool:
    methods = getattr(route, "methods", None) or ()
    return getattr(route, "path", None) in paths and "GET" in methods and set(methods) <= {"GET", "HEAD"}


async def liveness_endpoint(request: Request) -> Response:
    """The process answers: nothing is checked, so a probe never restarts a server that is only busy."""
    return JSONResponse({"status": "ok"})


OPEN_EPISODES_HEADER = "gymhost-open-episodes"  # an app's readiness answer's: its episodes open now, from memory


async def readiness_endpoint(request: Request) -> Response:
    """One app's readiness, or a gateway's: ready when every mount is. The answer also says how many episodes are
    open (``OPEN_EPISODES_HEADER``; a gateway's, of every mount), which a gateway running the app as a process mount
    waits for in a drain: counted in the process, where its ``/metrics`` adds up values files that the code a
    confined server runs may write."""
    reasons = _not_ready(request.app)
    headers = {OPEN_EPISODES_HEADER: str(_open_episodes(request.app))}
    if reasons:
        return JSONResponse({"status": "unavailable", "reason": reasons}, status_code=503, headers=headers)
    return JSONResponse({"status": "ok"}, headers=headers)


async def metrics_endpoint(request: Request) -> Response:
    """The metrics as they are now: the gauges of this app (or of every mount of a gateway) are refreshed first, so
    an episode that ended a moment ago is not still counted open."""
    operations = OPERATIONS.get(request.app)
    own = [operations] if isinstance(operations, Operations) else []
    for each in own if operations is not None else _mounts_operations(request.app):
        with contextlib.suppress(Exception):  # a gauge is not worth a failed scrape
            each.refresh_gauges()
    body = await asyncio.to_thread(render, operations.mount if operations is not None else None)
    return Response(body, media_type=CONTENT_TYPE)


def _open_episodes(app: Any) -> int:
    operations = OPERATIONS.get(app)
    if operations is not None:
        return operations.open_episodes()
    return sum(_open_episodes(child) for child in (MOUNTS.get(app) or {}).values())


def _mounts_operations(app: Any) -> list[Operations]:
    found = (OPERATIONS.get(child) for child in (MOUNTS.get(app) or {}).values())
    return [operations for operations in found if isinstance(operations, Operations)]


def _not_ready(app: Any) -> str | dict[str, str] | None:
    operations = OPERATIONS.get(app)
    if operations is not None:
        return operations.not_ready()
    mounts = MOUNTS.get(app) or {}  # a gateway's: {prefix: app}
    if drain.draining:
        return NOT_READY
    reasons = {prefix: reason for prefix, child in mounts.items() if (reason := _reason_of(child)) is not None}
    return reasons or None


def _reason_of(app: Any) -> str | None:
    reason = _not_ready(app)
    return None if reason is None else str(reason)


async def _refresh(operations: Operations) -> None:
    while True:
        with contextlib.suppress(Exception):  # a gauge is not worth a crash
            operations.refresh_gauges()
        await asyncio.sleep(_GAUGE_EVERY_S)
