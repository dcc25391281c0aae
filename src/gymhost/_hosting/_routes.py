"""A served app's routes, the ones an episode calls most first.

Starlette's router tries an app's routes in order until one takes the request, a regular-expression match each.
A Gym server's tool routes come last: FastAPI's documentation routes, gymhost's liveness, ``/readyz`` and
``/metrics``, Gym's seed and verify routes, and a written server's pool status all come before them, about twenty
matches on every tool call, the call an episode makes most. ``hot_routes_first`` moves the tool routes (fixed-path
POST routes) to the front, then the routes an episode calls once (its seed, verify, close), and leaves the rest in
their order. The OpenAPI document, made from the routes in order, lists the tools first too.

A route moves only ahead of routes that cannot take any request it takes (none matches its path), so every request
is answered by the route that answered it before, its 405s and slash redirects included.
"""

from __future__ import annotations

from typing import Any

from starlette.routing import BaseRoute, Match, Mount, Route, Router

__all__ = ["hot_routes_first"]

# POST routes an episode calls once, not on every turn: after the tool routes.
_ONCE_AN_EPISODE = frozenset({"/seed_session", "/verify", "/close_session", "/aggregate_metrics", "/reset", "/close"})
_REST = 2  # the tier of every route that is not moved


def hot_routes_first(router: Router) -> None:
    """Reorder ``router.routes`` in place: tool routes, then the once-an-episode ones, then the rest as they were."""
    routes = list(router.routes)
    moved: list[BaseRoute] = []
    moved_ids: set[int] = set()
    for tier in range(_REST):
        for index, route in enumerate(routes):
            if _tier(route) != tier:
                continue
            jumped = (other for other in routes[:index] if id(other) not in moved_ids)
            if not any(_may_take(other, route) for other in jumped):
                moved.append(route)
                moved_ids.add(id(route))
    router.routes[:] = moved + [route for route in routes if id(route) not in moved_ids]


def _tier(route: BaseRoute) -> int:
    if not (isinstance(route, Route) and route.methods and "POST" in route.methods and not route.param_convertors):
        return _REST
    return 1 if route.path in _ONCE_AN_EPISODE else 0


def _may_take(other: BaseRoute, route: BaseRoute) -> bool:
    """Whether ``other`` could take a request to the fixed path of ``route`` (a route of a kind not known here,
    a host route say, or one that cannot tell from a bare request, is taken to take anything)."""
    if not isinstance(other, (Route, Mount)):
        return True
    path = getattr(route, "path", "")
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": path, "root_path": "", "headers": []}
    scope |= {"raw_path": path.encode(), "query_string": b""}
    try:
        match, _ = other.matches(scope)
    except Exception:
        return True
    return match is not Match.NONE
