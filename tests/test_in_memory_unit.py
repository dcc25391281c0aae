"""An in-process instance's app called directly (``_in_memory``) sees and answers what httpx's client over its ASGI
transport made it see and answer: the request's method, path, query, body and host; the answer's status, headers and
body, error answers readable by agentenv's ``ExtensionCallError``; the app's own exceptions raised."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from agentenv_protocol.client import ExtensionCallError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gymhost.environments._agentenv import _in_memory

pytestmark = [pytest.mark.unit, pytest.mark.anyio]

BASE_URL = "http://instance-3.in-process"


async def echo(request: Request) -> Response:
    """What the app was asked, as JSON; ``?status=N`` answers with that status."""
    seen = {
        "method": request.method,
        "path": request.url.path,
        "raw_path": request.scope["raw_path"].decode(),
        "query": request.scope["query_string"].decode(),
        "host": request.headers.get("host"),
        "content_type": request.headers.get("content-type"),
        "content_length": request.headers.get("content-length"),
        "body": (await request.body()).decode(),
        "client": list(request.client) if request.client else None,
    }
    status = int(request.query_params.get("status", 200))
    return JSONResponse(seen, status_code=status, headers={"x-seen": "yes"})


async def chunks(request: Request) -> Response:
    async def parts() -> AsyncIterator[bytes]:
        for part in (b'{"parts": ', b"[1, 2", b"]}"):
            yield part

    return StreamingResponse(parts(), media_type="application/json")  # listens for the disconnect meanwhile


async def broken(request: Request) -> Response:
    raise RuntimeError("the environment's own bug")


APP = Starlette(
    routes=[
        Route("/{rest:path}/chunks", chunks, methods=["GET"]),
        Route("/broken", broken, methods=["POST"]),
        Route("/{rest:path}", echo, methods=["GET", "POST", "DELETE"]),
    ]
)

REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    ("GET", "/.well-known/agentenv.json", {}),
    ("POST", "/agentenv", {"json": {"jsonrpc": "2.0", "id": 1, "method": "data/add", "params": {"parts": ["é", 1]}}}),
    ("GET", "/ext/score", {"params": {"task": "a b", "n": 3, "flag": True, "tags": ["x", "y"], "none": None}}),
    ("GET", "/ext/score?kept=1", {}),
    ("GET", "/ext/score?kept=1", {"params": {"added": "2"}}),  # as the installed httpx joins them (0.28 drops kept)
    ("GET", "/ext/score?lang=é&q=a+b", {}),
    ("GET", "/ext/naïve/x", {}),
    ("GET", "/ext/a%20b/c%2Fd", {}),
    ("POST", "/ext/grade", {"json": []}),
    ("DELETE", "/ext/thing", {}),
    ("GET", "/ext/chunks", {}),
    ("POST", "/ext/x", {"json": {"status": "ignored"}, "params": {"status": 422}}),
]


def seen(answer: httpx.Response) -> Any:
    """What the echo saw, its body read as JSON (httpx's own spacing differs between versions) and its length
    checked against it."""
    seen = answer.json()
    if not isinstance(seen, dict) or "body" not in seen:
        return seen
    body = seen.pop("body")
    if seen.pop("content_length") is not None:
        assert seen.get("content_type") == "application/json"
        assert int(answer.json()["content_length"]) == len(body.encode())
    return {**seen, "body": json.loads(body) if body else None}


@pytest.mark.parametrize(("method", "path", "given"), REQUESTS)
async def test_the_app_sees_and_answers_what_it_does_through_httpx(
    method: str, path: str, given: dict[str, Any]
) -> None:
    async with httpx.AsyncClient(base_url=BASE_URL, transport=httpx.ASGITransport(app=APP)) as client:
        expected = await client.request(method, path, **given)
    answered = await _in_memory.request(APP, BASE_URL, method, path, **given)
    assert answered.status_code == expected.status_code
    assert seen(answered) == seen(expected)
    assert answered.headers.get("content-type") == expected.headers.get("content-type")
    assert answered.headers.get("x-seen") == expected.headers.get("x-seen")


async def test_an_error_answer_is_readable_as_agentenv_reads_one() -> None:
    answered = await _in_memory.request(APP, BASE_URL, "POST", "/ext/x", json={}, params={"status": 409})
    error = ExtensionCallError(answered)
    assert answered.status_code == 409
    assert str(answered.request.url) == f"{BASE_URL}/ext/x?status=409"
    assert error.response is answered
    assert str(error).startswith("409 ")


async def test_what_the_app_raises_is_raised_as_httpx_raises_it() -> None:
    async with httpx.AsyncClient(base_url=BASE_URL, transport=httpx.ASGITransport(app=APP)) as client:
        with pytest.raises(RuntimeError, match="own bug"):
            await client.post("/broken", json={})
    with pytest.raises(RuntimeError, match="own bug"):
        await _in_memory.request(APP, BASE_URL, "POST", "/broken", json={})


async def test_an_app_that_answers_nothing_is_an_error_not_an_empty_answer() -> None:
    async def silent(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})

    with pytest.raises(RuntimeError, match="without a complete answer"):
        await _in_memory.request(silent, BASE_URL, "GET", "/")


async def test_the_body_is_json_as_httpx_encodes_it() -> None:
    value = {"text": "naïve ✓", "n": [1, 2.5, None]}
    answered = await _in_memory.request(APP, BASE_URL, "POST", "/agentenv", json=value)
    assert json.loads(answered.json()["body"]) == value
