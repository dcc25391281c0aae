"""The request guard and the bearer token on a plain Starlette app: what a client sees, without nemo-gym."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from gymhost import NO_TOKEN, ServeError
from gymhost._config import resolve_token
from gymhost.middleware.auth import BearerTokenMiddleware
from gymhost.middleware.request_guard import RequestGuardMiddleware, json_problem

pytestmark = [pytest.mark.unit, pytest.mark.anyio]

TOKEN = "s3cret-token"


async def echo(request: Request) -> JSONResponse:
    """Parses the body as a Gym server does, and answers it: what breaks on surrogates and deep nesting."""
    return JSONResponse({"got": json.loads(await request.body() or b"null")})


async def length(request: Request) -> JSONResponse:
    return JSONResponse({"length": len(await request.body())})


async def live(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


def app(**guard: Any) -> Starlette:
    routes = [
        Route("/echo", echo, methods=["POST"]),
        Route("/length", length, methods=["POST"]),
        Route("/health", live),
        Route("/", live),
    ]
    inner = Starlette(routes=routes)
    inner.add_middleware(RequestGuardMiddleware, **guard)
    return inner


async def post(
    target: Any, body: bytes | AsyncIterator[bytes], path: str = "/echo", content_type: str = "application/json"
) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=target), base_url="http://t") as client:
        headers = {"content-type": content_type} if content_type else {}
        return await client.post(path, content=body, headers=headers)


async def test_a_body_over_the_limit_is_refused_by_its_declared_length() -> None:
    answer = await post(app(max_body_bytes=100), b"[" + b"1," * 100 + b"1]")
    assert answer.status_code == 413
    assert answer.json() == {"detail": "the request body is larger than this server's limit of 100 bytes"}


async def test_a_streamed_body_is_cut_off_when_it_passes_the_limit() -> None:
    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the limit must be counted as it arrives
        yield b"[" + b"1," * 40
        yield b"1," * 40
        yield b"1]"

    assert (await post(app(max_body_bytes=100), chunks())).status_code == 413
    assert (await post(app(max_body_bytes=1000), chunks())).json() == {"got": [1] * 81}


@pytest.mark.parametrize(
    ("body", "refused"),
    [
        (json.dumps({"text": "caf\u00e9 \U0001f600"}).encode(), False),  # an escaped surrogate pair is an emoji
        ('{"text": "caf\u00e9 \U0001f600"}'.encode(), False),  # the same, raw UTF-8
        (b'{"text": "\\ud800"}', True),
        (b'{"text": "\\udc00 after"}', True),
        (b'{"text": "\\ud83d then \\ude00"}', True),  # a pair must be adjacent
        (b'{"text": "\\\\ud800"}', False),  # an escaped backslash: the text "\ud800", not an escape
        (b'{"text": "\\\\\\ud800"}', True),  # a backslash, then a real escape
    ],
)
async def test_lone_surrogate_escapes_are_refused_before_the_app_parses_them(body: bytes, refused: bool) -> None:
    answer = await post(app(), body)
    if refused:
        assert answer.status_code == 400
        assert "lone UTF-16 surrogate" in answer.json()["detail"]
    else:
        assert answer.status_code == 200
        assert answer.json()["got"] == json.loads(body)


async def test_nesting_beyond_the_depth_limit_is_refused_and_brackets_in_strings_do_not_count() -> None:
    assert (await post(app(max_json_depth=10), b"[" * 11 + b"]" * 11)).json() == {
        "detail": "the body's JSON is nested more than 10 levels deep"
    }
    assert (await post(app(max_json_depth=10), b"[" * 10 + b"]" * 10)).status_code == 200
    in_a_string = json.dumps({"text": "[{" * 50 + '"' + "]}" * 50}).encode()
    assert (await post(app(max_json_depth=10), in_a_string)).status_code == 200
    # The default limit answers what the parser could not: 100,000 levels would overflow its recursion.
    assert (await post(app(), b"[" * 100_000 + b"]" * 100_000)).status_code == 400


@pytest.mark.parametrize(
    ("body", "refused"),
    [
        (b'{"x": NaN}', "NaN or Infinity"),
        (b"[-Infinity]", "NaN or Infinity"),
        (b'{"x": "NaN and Infinity, in words"}', None),
        (b'{"x": "\xff"}', "not UTF-8 text (byte 7: invalid start byte)"),
    ],
)
@pytest.mark.parametrize("content_type", ["application/json", "text/plain", ""])
async def test_values_no_json_encoder_writes_back_are_refused(
    body: bytes, refused: str | None, content_type: str
) -> None:
    """FastAPI's 422 repeats the input; NaN, or bytes that are not UTF-8, in it made that answer a 500. A tool
    route parses any body as JSON, so text and undeclared bodies are checked too."""
    answer = await post(app(), body, path="/length", content_type=content_type)
    if refused:
        assert answer.status_code == 400
        assert refused in answer.json()["detail"]
    else:
        assert answer.json() == {"length": len(body)}


async def test_a_body_of_another_type_is_only_size_checked() -> None:
    body = b"[[[[\\ud800 NaN \xff]]]]"
    assert json_problem(body, 2) is not None  # as JSON, these bytes would be refused on several counts
    answer = await post(app(max_json_depth=2), body, path="/length", content_type="application/octet-stream")
    assert answer.json() == {"length": len(body)}
    too_long = await post(app(max_body_bytes=4), body, path="/length", content_type="application/octet-stream")
    assert too_long.status_code == 413


def token_app() -> Starlette:
    outer = Starlette(routes=[Mount("/mounted", app()), Route("/health", live), Route("/", live)])
    outer.add_middleware(BearerTokenMiddleware, token=TOKEN, open_paths={"/health", "/mounted/health"})
    return outer


async def test_every_route_but_liveness_needs_the_token() -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=token_app()), base_url="http://t") as client:
        for path in ("/health", "/mounted/health"):
            assert (await client.get(path)).status_code == 200
        missing = await client.get("/")
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"] == "Bearer"
        assert missing.json()["detail"].endswith("the request had no bearer token")
        wrong = await client.post("/mounted/echo", json=1, headers={"authorization": "Bearer s3cret-tokeN"})
        assert (wrong.status_code, TOKEN in wrong.text) == (401, False)
        assert (await client.post("/mounted/health", headers={"authorization": "x"})).status_code == 401  # GET only
        right = await client.post("/mounted/echo", json=1, headers={"authorization": f"Bearer {TOKEN}"})
        assert right.json() == {"got": 1}


def test_the_token_comes_from_the_environment_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GYMHOST_TOKEN", raising=False)
    assert resolve_token(None) is None
    monkeypatch.setenv("GYMHOST_TOKEN", "from-env")
    assert (resolve_token(None), resolve_token("given"), resolve_token(NO_TOKEN)) == ("from-env", "given", None)


def test_an_empty_token_is_refused_because_off_is_said_with_no_token() -> None:
    with pytest.raises(ServeError, match="NO_TOKEN"):
        resolve_token("")


@pytest.mark.parametrize("body", [b'{"t": 1e999}', b"[1E+400]", b"[" + b"9" * 400 + b".5]"])
async def test_numbers_that_overflow_to_infinity_are_refused(body: bytes) -> None:
    """``json.loads`` reads them as inf: as invalid in an answer as NaN is."""
    answer = await post(app(), body)
    assert answer.status_code == 400
    assert "too large for a float" in answer.json()["detail"]
    assert (await post(app(), b'{"t": 1e308, "s": "1e999"}')).status_code == 200


async def test_an_unterminated_string_after_many_brackets_is_scanned_in_one_pass() -> None:
    """A string left open made the depth scan restart at every later quote: a few hundred KB held the event loop
    for minutes. Now the end of the body closes the string, and the scan answers at once."""
    body = b"[" * 200 + b'"' + b'\\"' * 200_000
    assert json_problem(body, 128) == "the body's JSON is nested more than 128 levels deep"
    assert json_problem(b"[" * 100 + b'"' + b'\\"' * 200_000, 128) is None


def mounted_token_app() -> Starlette:
    """The token middleware inside a mount, as create_app installs it: open paths are relative to the mount."""
    inner = app()
    inner.add_middleware(BearerTokenMiddleware, token=TOKEN)
    return Starlette(routes=[Mount("/m", inner), Mount("/mx", app())])


async def test_inside_a_mount_probes_are_open_relative_to_it_and_the_scheme_is_case_insensitive() -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mounted_token_app()), base_url="http://t") as c:
        assert (await c.get("/m/health")).status_code == 200
        assert (await c.post("/m/echo", json=1)).status_code == 401
        for scheme in ("Bearer", "bearer", "BEARER"):
            assert (await c.post("/m/echo", json=1, headers={"authorization": f"{scheme} {TOKEN}"})).status_code == 200
        assert (await c.post("/m/echo", json=1, headers={"authorization": f"Basic {TOKEN}"})).status_code == 401


def test_a_token_that_cannot_travel_in_a_header_is_refused_without_being_echoed() -> None:
    from gymhost import ServeError

    with pytest.raises(ServeError, match="printable ASCII") as raised:
        resolve_token("caf\u00e9-token")
    assert "caf" not in str(raised.value)
