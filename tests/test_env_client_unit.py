"""What EnvClient makes of replies that are not the protocol, from a real ASGI app answering them."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gymhost.environments._agentenv._client import EnvClient
from gymhost.environments._errors import DataPlaneError, MalformedReplyError

pytestmark = [pytest.mark.unit, pytest.mark.anyio]


def answering(reply: Any, status: int = 200) -> EnvClient:
    async def agentenv(request: Request) -> Response:
        if isinstance(reply, bytes):
            return Response(reply, status_code=status, media_type="application/json")
        return JSONResponse(reply, status_code=status)

    app = Starlette(routes=[Route("/agentenv", agentenv, methods=["POST"])])
    return EnvClient("http://instance.test", transport=httpx.ASGITransport(app=app), data_timeout=30.0)


@pytest.mark.parametrize(
    "reply",
    [
        {"jsonrpc": "2.0", "id": 1, "error": "boom"},  # an error that is no JSON-RPC error object
        {"jsonrpc": "2.0", "id": 1},  # neither result nor error
        [1, 2],
        b"\x00\x01 not json",
    ],
)
async def test_a_reply_that_is_not_json_rpc_says_the_instance_is_broken(reply: Any) -> None:
    with pytest.raises(MalformedReplyError):
        await answering(reply).clear()


async def test_an_error_the_protocol_carries_is_the_environments_answer_not_a_broken_instance() -> None:
    refused = {"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad seed"}}
    with pytest.raises(DataPlaneError, match="bad seed") as raised:
        await answering(refused).clear()
    assert not isinstance(raised.value, MalformedReplyError)
