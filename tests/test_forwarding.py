"""Forwarding to the process that owns a session, when that process is busy or gone: a busy owner (its listen queue
full, as under a burst) is waited for and answers; one busy past the patience is reported busy, a gone one gone,
each logged and counted, never mistaken for the other. The owner is a real uvicorn on a Unix socket."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from prometheus_client import REGISTRY
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gymhost._sessions import _forwarding
from gymhost._sessions._forwarding import Forwarded, forward

pytestmark = [pytest.mark.unit, pytest.mark.anyio]


async def owner(request: Request) -> JSONResponse:
    return JSONResponse({"answered_by": "owner", "got": (await request.body()).decode()})


def full_socket(path: Path) -> tuple[socket.socket, list[socket.socket]]:
    """A listening Unix socket whose queue is full: nothing accepts, so a new connect is refused with EAGAIN."""
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(str(path))
    listening.listen(0)
    queued = []
    while True:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.setblocking(False)
        try:
            client.connect(str(path))
        except BlockingIOError:
            client.close()
            return listening, queued
        queued.append(client)


@asynccontextmanager
async def serving_on(listening: socket.socket) -> AsyncIterator[None]:
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/", owner, methods=["POST"])]), log_level="error"))
    task = asyncio.create_task(server.serve(sockets=[listening]))
    try:
        yield
    finally:
        server.should_exit = True
        await task


def failures(reason: str) -> float:
    return REGISTRY.get_sample_value("gymhost_forward_failures_total", {"target": "worker", "reason": reason}) or 0.0


class Client:
    """The client's side of one request: what the ASGI server would be sent."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.scope = {"type": "http", "method": "POST", "path": "/", "raw_path": b"/", "query_string": b"",
                      "headers": [(b"host", b"gymhost.test")]}  # fmt: skip

    async def receive(self) -> dict[str, Any]:
        return {"type": "http.request", "body": b"a tool call", "more_body": False}

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    async def forward(self, path: Path) -> Forwarded:
        return await forward(self.scope, self.receive, self.send, ("worker", str(path)))


async def test_a_busy_owner_is_waited_for_and_answers(tmp_path: Path) -> None:
    path = tmp_path / "worker-1.sock"
    listening, queued = full_socket(path)
    client = Client()
    attempt = asyncio.create_task(client.forward(path))
    await asyncio.sleep(0.5)  # the forward keeps trying meanwhile: nothing was sent, so nothing is lost
    assert not attempt.done()
    assert client.messages == []
    for waiting in queued:
        waiting.close()
    async with serving_on(listening):
        assert await attempt is Forwarded.ANSWERED
    assert client.messages[0]["status"] == 200
    assert b'"got":"a tool call"' in b"".join(message.get("body", b"") for message in client.messages)


async def test_an_owner_busy_past_the_patience_is_busy_not_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_forwarding, "_PATIENCE_S", 0.3)
    monkeypatch.setattr(_forwarding, "_warn", _forwarding.RateLimitedWarning(_forwarding.logger, every_s=0))
    path = tmp_path / "worker-1.sock"
    listening, queued = full_socket(path)
    before = failures("busy")
    client = Client()
    with caplog.at_level(logging.WARNING, logger="gymhost"):
        assert await client.forward(path) is Forwarded.BUSY
    assert client.messages == [], "nothing was answered: the caller answers 503"
    assert failures("busy") == before + 1
    assert f"could not forward a request to the worker at {path}, which owns its session: busy" in caplog.text
    for waiting in [*queued, listening]:
        waiting.close()


async def test_a_gone_owner_is_gone_at_once(tmp_path: Path) -> None:
    before = failures("gone")
    missing = tmp_path / "worker-1.sock"
    assert await Client().forward(missing) is Forwarded.GONE
    closed = tmp_path / "worker-2.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(closed))
    stale.close()  # the file stays, nobody listens: refused
    assert await Client().forward(closed) is Forwarded.GONE  # refused: gone, not busy (busy would wait, then say so)
    assert failures("gone") == before + 2
