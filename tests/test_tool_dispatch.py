"""A written server's tool routes answer exactly what FastAPI's own dispatch answered.

A written server's tool endpoints read the request and answer the response themselves, so their routes skip the
handler FastAPI builds around an endpoint (``_server._ToolRoute``). Held here against FastAPI's own ``APIRoute``:
every written example (gridsim, a bundle; the counter bundle; OpenEnv's sums server; agent-env's quiz), served
twice in this process, once each way, with the same calls sent to both: good calls, bad JSON, a wrong type, a
missing field, a body that is not an object, not UTF-8 or empty, NaN, an unknown tool, and a call with no session.
Status, headers and body must agree, byte for byte (the session cookie's signed value aside).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from gymhost import create_app
from gymhost.environments import write_folder as write_gridsim

from .agentenv_helpers import GRIDSIM, make_bundle
from .processes import ServerProcess, free_port, serving
from .test_agent_env import BUNDLE as QUIZ
from .test_agent_env import agent_env_python
from .test_agent_env import write as write_agent_env
from .test_openenv import openenv_server
from .test_openenv import write as write_openenv

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

GYM_ROUTES = {"/seed_session", "/verify", "/close_session", "/aggregate_metrics"}
# Bodies every tool gets, whatever its arguments.
ANY_TOOL = [b"{", b"[1]", b'"x"', b"", b"\xff\xfe", b'{"a": NaN}', b'{"a": 1e999}', b"null"]


@pytest.fixture(scope="module")
def openenv() -> Iterator[ServerProcess]:
    with openenv_server(sessions=2) as running:  # one session for each of the two apps
        yield running


@pytest.fixture(scope="module")
def agent_env_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    server = Path(__file__).with_name("agent_env_server.py")
    state = tmp_path_factory.mktemp("agent-env-state")
    with serving(
        [agent_env_python(), str(server), str(QUIZ), str(port)],
        env={"XDG_STATE_HOME": str(state)},
        url=f"http://127.0.0.1:{port}",
        ready_path="/health",
    ):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(params=["gridsim", "counter", "openenv_sums", "agent_env_quiz"])
def folder(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    if request.param == "gridsim":
        return write_gridsim(str(GRIDSIM), tmp_path, mode="in-process").path
    if request.param == "counter":
        return write_gridsim(str(make_bundle(tmp_path / "bundles")), tmp_path / "root", mode="in-process").path
    if request.param == "openenv_sums":
        return write_openenv(request.getfixturevalue("openenv").url, tmp_path)
    return write_agent_env(request.getfixturevalue("agent_env_url"), tmp_path)


@asynccontextmanager
async def both_ways(folder: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Any, Any]]:
    """The folder's app with gymhost's tool routes, first among its routes, and again with FastAPI's ``APIRoute``
    in FastAPI's order, last (the tool routes are added as the lifespan starts), both running."""
    from fastapi.routing import APIRoute

    from gymhost._hosting import _routes  # (imported here: the unit tier collects this file without FastAPI)
    from gymhost.environments import _server

    async with AsyncExitStack() as stack:
        ours = create_app(folder)
        await stack.enter_async_context(ours.router.lifespan_context(ours))
        with monkeypatch.context() as patch:
            patch.setattr(_server, "_ToolRoute", APIRoute)
            patch.setattr(_server, "hot_routes_first", lambda router: None)
            patch.setattr(_routes, "hot_routes_first", lambda router: None)
            fastapis = create_app(folder)
            await stack.enter_async_context(fastapis.router.lifespan_context(fastapis))
        yield ours, fastapis


def tool_paths(app: Any) -> dict[str, dict[str, Any]]:
    """Each tool route's path and its arguments' JSON schema, from the OpenAPI document."""
    found = {}
    for path, operations in app.openapi()["paths"].items():
        if path not in GYM_ROUTES and "post" in operations:
            content = operations["post"].get("requestBody", {}).get("content", {})
            found[path] = content.get("application/json", {}).get("schema", {})
    return found


def calls_for(schema: dict[str, Any]) -> list[bytes]:
    """A good call, then one with each argument of the wrong type, one missing its required arguments, and one
    with an argument it does not take."""
    samples = {"string": '"a"', "integer": "1", "number": "1.5", "boolean": "true", "array": "[]", "object": "{}"}
    properties: dict[str, Any] = schema.get("properties") or {}

    def value(spec: dict[str, Any]) -> str:
        if "enum" in spec:
            return httpx._content.json_dumps(spec["enum"][0])  # type: ignore[attr-defined]
        return samples.get(spec.get("type", "string"), '"a"')

    good = "{" + ", ".join(f'"{name}": {value(spec)}' for name, spec in properties.items()) + "}"
    calls = [good.encode()]
    for name, spec in properties.items():
        wrong = '"not a number"' if spec.get("type") in ("integer", "number", "boolean") else "[[1]]"
        calls.append(good.replace(f'"{name}": {value(spec)}', f'"{name}": {wrong}').encode())
    calls += [b"{}", good[:-1].encode() + (b', "extra": 1}' if properties else b'"extra": 1}')]
    return calls


def normalized(response: httpx.Response) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers and body, the session cookie's signed value (random per app) left out."""
    headers = [
        (name, re.sub(r"=[^;]*;", "=<signed>;", value, count=1) if name == "set-cookie" else value)
        for name, value in response.headers.multi_items()
    ]
    return response.status_code, headers, response.content


async def test_tool_routes_answer_what_fastapis_dispatch_answers(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.routing import APIRoute

    from gymhost.environments._server import _ToolRoute

    row = json.loads(next(iter(sorted((folder / "data").glob("*.jsonl")))).read_text().splitlines()[0])
    async with both_ways(folder, monkeypatch) as (ours, fastapis):
        tools = tool_paths(ours)
        assert tools, "the folder's tools are in its OpenAPI document"
        assert ours.openapi() == fastapis.openapi(), "the tool routes are documented as before (tools listed first)"
        kinds = [{type(r) for r in app.routes if getattr(r, "path", None) in tools} for app in (ours, fastapis)]
        assert kinds == [{_ToolRoute}, {APIRoute}], "the comparison is with FastAPI's own dispatch"
        firsts = [{getattr(r, "path", None) for r in app.routes[: len(tools)]} for app in (ours, fastapis)]
        assert firsts[0] == set(tools), "gymhost's tool routes come first"
        assert not firsts[1] & set(tools), "and are compared with the routes in FastAPI's order"

        clients = [
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") for app in (ours, fastapis)
        ]
        async with clients[0], clients[1]:
            json_type = {"content-type": "application/json"}
            for path in tools:  # before any seed: no session
                answers = [await client.post(path, content=b"{}", headers=json_type) for client in clients]
                assert normalized(answers[0]) == normalized(answers[1]), path
            for client in clients:
                assert (await client.post("/seed_session", json=row)).status_code == 200
            compared = 0
            for path, schema in tools.items():
                for body in [*calls_for(schema), *ANY_TOOL]:
                    answers = [await client.post(path, content=body, headers=json_type) for client in clients]
                    assert normalized(answers[0]) == normalized(answers[1]), (path, body)
                    compared += 1
            answers = [await client.post("/no_such_tool", content=b"{}", headers=json_type) for client in clients]
            assert normalized(answers[0]) == normalized(answers[1])
            assert answers[0].status_code == 404
            # Other methods and a trailing slash, on the routes that moved and on one that did not.
            for path in [*tools, "/seed_session", "/verify"]:
                for method, target in (("GET", path), ("PUT", path), ("POST", path + "/")):
                    answers = [await client.request(method, target, content=b"{}") for client in clients]
                    assert normalized(answers[0]) == normalized(answers[1]), (method, target)
    assert compared >= len(tools) * (len(ANY_TOOL) + 2)
