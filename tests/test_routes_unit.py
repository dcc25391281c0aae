"""The tool routes first (``_hosting._routes.hot_routes_first``): every request answered by the route that answered it
before, whatever the routes around it; and the liveness routes every app answers (``_hosting._operating``), whatever
routes the server has. Without nemo-gym."""

from __future__ import annotations

import itertools

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import BaseRoute, Host, Match, Mount, Route
from starlette.types import Scope

from gymhost._hosting._operating import add_operating_routes
from gymhost._hosting._routes import hot_routes_first
from gymhost._nemo_gym import LIVENESS_ROUTES
from gymhost.middleware.auth import BearerTokenMiddleware

pytestmark = [pytest.mark.unit, pytest.mark.anyio]


def answer(name: str) -> PlainTextResponse:
    return PlainTextResponse(name)


def route(path: str, name: str, methods: list[str]) -> Route:
    async def endpoint(request: Request) -> PlainTextResponse:
        return answer(f"{name} {request.path_params}")

    return Route(path, endpoint, methods=methods)


def routes() -> list[BaseRoute]:
    """A Gym server's routes, in the order Gym and gymhost add them, with the ways a moved route could go wrong:
    a catch-all before a tool (it must keep the tool), a GET route of a tool's path, a mount over a path."""
    return [
        route("/readyz", "readyz", ["GET"]),
        route("/docs", "docs", ["GET"]),
        route("/seed_session", "seed", ["POST"]),
        route("/verify", "verify", ["POST"]),
        route("/agentenv/pool/{index}", "instance", ["GET"]),
        route("/shadowed", "shadowed-get", ["GET"]),  # a tool's path, another method: its 405s are this route's
        route("/{name}/state", "state", ["POST"]),
        Mount("/mounted", routes=[route("/inner", "inner", ["POST"])]),
        route("/look", "look", ["POST"]),
        route("/move", "move", ["POST"]),
        route("/shadowed", "shadowed-post", ["POST"]),
        route("/mounted/tool", "mounted-tool", ["POST"]),  # the mount takes it first: it must not move
        route("/{name}", "unknown", ["POST"]),  # last, so it answers what no tool took
        route("/after", "after", ["POST"]),  # after the catch-all, which takes it: it must not move
    ]


class Unreadable(Route):
    """A route of a kind that cannot tell from a bare request whether it takes it."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if "user" not in scope:
            raise KeyError("user")
        return super().matches(scope)


def test_nothing_moves_past_a_route_that_may_take_anything() -> None:
    for blocker in (Host("tools.example", app=Starlette()), Unreadable("/{name}", answer, methods=["POST"])):
        app = Starlette(routes=[route("/seed_session", "seed", ["POST"]), blocker, route("/look", "look", ["POST"])])
        hot_routes_first(app.router)
        assert app.router.routes[1] is blocker, type(blocker).__name__


def test_tools_come_first_then_the_once_an_episode_routes() -> None:
    app = Starlette(routes=routes())
    hot_routes_first(app.router)
    paths = [getattr(r, "path", None) for r in app.router.routes]
    assert paths[:4] == ["/look", "/move", "/seed_session", "/verify"]
    for stays in ("/mounted/tool", "/after"):
        assert paths.index(stays) > paths.index("/mounted"), stays


async def test_every_request_is_answered_as_before() -> None:
    before, after = Starlette(routes=routes()), Starlette(routes=routes())
    hot_routes_first(after.router)
    assert [getattr(r, "path", None) for r in before.routes] != [getattr(r, "path", None) for r in after.routes]
    paths = ["/readyz", "/docs", "/seed_session", "/verify", "/agentenv/pool/3", "/shadowed", "/x/state", "/look"]
    paths += ["/move", "/mounted/inner", "/mounted/tool", "/after", "/anything", "/look/", "/seed_session/", "/"]
    clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=a), base_url="http://t") for a in (before, after)]
    async with clients[0], clients[1]:
        for path, method in itertools.product(paths, ["GET", "POST", "PUT", "HEAD"]):
            answers = [await client.request(method, path) for client in clients]
            seen = [(a.status_code, sorted(a.headers.items()), a.content) for a in answers]
            assert seen[0] == seen[1], (method, path)


# -- liveness: ``_operating.add_operating_routes`` ------------------------------------------------------------------


def served_routes() -> list[BaseRoute]:
    """What a server may have at the liveness paths before gymhost answers them: Gym's own liveness (nemo-gym 0.4.0
    has "/" alone), a server's own POST tool named ``health``, and a written server's catch-all ``POST /{name}``,
    which made every liveness path Gym did not serve a 405."""
    return [
        route("/health", "health-tool", ["POST"]),
        route("/", "gyms-liveness", ["GET"]),
        route("/readyz", "gyms-readiness", ["GET"]),
        route("/{name}", "unknown", ["POST"]),
    ]


async def test_every_liveness_path_answers_whatever_routes_the_server_has() -> None:
    app = Starlette(routes=served_routes())
    add_operating_routes(app, liveness=LIVENESS_ROUTES)
    hot_routes_first(app.router)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        for path in LIVENESS_ROUTES:
            answer = await client.get(path)
            assert (answer.status_code, answer.json()) == (200, {"status": "ok"}), path
            assert (await client.head(path)).status_code == 200, path
        assert (await client.get("/readyz")).json() == {"status": "ok"}, "gymhost's readiness, not Gym's"
        tool = await client.post("/health")
        assert (tool.status_code, tool.text) == (200, "health-tool {}"), "a tool named health is still a tool"
        unknown = await client.post("/livez")
        assert unknown.text == "unknown {'name': 'livez'}", "a POST goes where it went before"
    assert [getattr(r, "path", None) for r in app.routes].count("/") == 1, "Gym's liveness is replaced, not shadowed"


async def test_a_token_leaves_every_liveness_path_and_readiness_open_and_nothing_else() -> None:
    app = Starlette(routes=served_routes(), middleware=[Middleware(BearerTokenMiddleware, token="t")])
    add_operating_routes(app, liveness=LIVENESS_ROUTES)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        for path in (*LIVENESS_ROUTES, "/readyz"):
            assert (await client.get(path)).status_code == 200, path
            assert (await client.head(path)).status_code == 200, path
        for method, path in (("GET", "/metrics"), ("POST", "/health"), ("POST", "/livez")):
            assert (await client.request(method, path)).status_code == 401, (method, path)
