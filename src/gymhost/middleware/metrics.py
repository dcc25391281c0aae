"""HTTP server metrics, as OpenTelemetry names them: request duration by method, route template and status, and
requests in flight. Pure ASGI; the label children are looked up once per distinct label set, so a request costs a
dict lookup and an ``observe``."""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._asgi import path_below_mount
from .._keys import FORWARDED
from .._metrics import HTTP_ACTIVE_REQUESTS, HTTP_REQUEST_DURATION, ROOT

__all__ = ["HttpMetricsMiddleware"]

_UNMATCHED = "(unmatched)"  # a path no route took (a 404): one series, however many such paths there are
_FORWARDED = "(forwarded)"  # answered by another process (``_sessions._forwarding``), which counts it too


class HttpMetricsMiddleware:
    """``mounts``: prefixes of apps below that time their own requests (a gateway's in-process mounts), whose
    requests pass on untimed here, so each request is counted once."""

    def __init__(self, app: ASGIApp, *, mounts: Collection[str] = ()) -> None:
        self.app = app
        self.mounts = tuple(mounts)
        self._durations: dict[tuple[str, str, str, int], Any] = {}
        self._active: dict[tuple[str, str], Any] = {}
        self._templates: dict[int, str] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self.mounts and self._mounted(scope)):
            await self.app(scope, receive, send)
            return
        mount, method = scope.get("root_path") or ROOT, scope["method"]
        active = self._active.get((mount, method))
        if active is None:
            active = self._active[(mount, method)] = HTTP_ACTIVE_REQUESTS.labels(mount, method)
        status = 500  # what the server answers when the app raises before it responds
        started = time.perf_counter()

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        active.inc()
        try:
            await self.app(scope, receive, send_status)
        finally:
            active.dec()
            route = self._template(scope)
            key = (mount, method, route, status)
            duration = self._durations.get(key)
            if duration is None:
                duration = self._durations[key] = HTTP_REQUEST_DURATION.labels(mount, method, route, str(status))
            duration.observe(time.perf_counter() - started)

    def _mounted(self, scope: Scope) -> bool:
        path = path_below_mount(scope)
        return any(path == mount or path.startswith(mount + "/") for mount in self.mounts)

    def _template(self, scope: Scope) -> str:
        """The matched route's path template. Starlette's router names the route in the scope; FastAPI's names only
        its own routes there, so for a plain Route or Mount the endpoint the router chose is looked up instead."""
        route = getattr(scope.get("route"), "path", None)
        if route:
            return str(route)
        if FORWARDED.get(scope):
            return _FORWARDED
        endpoint = scope.get("endpoint")
        if endpoint is None:
            return _UNMATCHED
        template = self._templates.get(id(endpoint))
        if template is None:
            routes = getattr(getattr(scope.get("app"), "router", None), "routes", [])
            for candidate in routes:
                target = getattr(candidate, "endpoint", None) or getattr(candidate, "app", None)
                if target is endpoint:
                    template = self._templates[id(endpoint)] = str(getattr(candidate, "path", _UNMATCHED))
                    break
        return template or _UNMATCHED
