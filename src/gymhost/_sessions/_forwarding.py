"""Forwarding a request to the process that owns its session, and its answer back, unchanged.

With several worker processes on one host (``gymhost serve --workers N``), the kernel hands each new connection to
whichever worker accepts it, and verifiers opens a new connection for every request: most calls of an episode reach
a worker that does not hold it. That worker reads the owner from the signed session (or MCP token) and forwards the
request over the owner's Unix socket; across hosts, to the URL the owning replica advertised. The request goes as it
came (method, path with any mount and ``/ng-rollout/<id>`` prefix, query, headers, body) and the owner's answer
streams back as it is, status, headers and body, event streams included.

A header marks a forwarded request, so it is forwarded at most once more and never in a loop: a request forwarded
from another replica may still go on to the right worker of this one; a request forwarded from a sibling worker is
answered where it lands.

An owner that cannot be reached is told apart by why. Gone (its socket is not there, or nothing listens on it: the
worker or replica is no more) is reported to the caller as ``GONE``, which answers it as a lost session. Busy (its
listen queue is full, or it does not accept in time, as under a burst of thousands of connections) is not a lost
episode: the connect is tried again for up to ``_PATIENCE_S``, since nothing was sent yet, and then reported as
``BUSY``, which the caller answers 503 with ``Retry-After``. Either is logged (at most once every 10 s) and counted in
``gymhost_forward_failures_total``.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import time

import httpx
from starlette.types import Receive, Scope, Send

from .._asgi import read_body
from .._keys import CLIENT_PATH, FORWARDED
from .._logging import RateLimitedWarning
from .._metrics import forward_failed
from ._identity import Target

__all__ = ["FORWARDED_HEADER", "Forwarded", "forward", "may_forward"]

logger = logging.getLogger("gymhost")

FORWARDED_HEADER = b"x-gymhost-forwarded"  # "replica" or "worker": the hop the request came by
_HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade", b"content-length", b"host"}
)
# The server in front adds its own: the owner's would be sent twice.
_SERVER_HEADERS = frozenset({b"date", b"server"})
_CONNECT_TIMEOUT_S = 5.0
_PATIENCE_S = 10.0  # how long a busy owner is tried again before the request is answered 503
_RETRY_FIRST_S, _RETRY_MOST_S = 0.01, 0.25
_GONE_ERRORS = (FileNotFoundError, ConnectionRefusedError)
# httpx's default of 100 connections a client would queue a burst's forwards behind each other, in the forwarding
# process, with no time limit: every request in flight gets a connection, and the owner's listen queue holds them.
_LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=256)
_warn = RateLimitedWarning(logger)
_clients: dict[tuple[int, Target], httpx.AsyncClient] = {}


def may_forward(scope: Scope, target: Target) -> bool:
    """A request goes at most one hop further, and only from a replica to one of its workers."""
    hop = next((value for name, value in scope["headers"] if name == FORWARDED_HEADER), None)
    return hop is None or (hop == b"replica" and target[0] == "worker")


class Forwarded(enum.Enum):
    """What became of a forward: the owner answered the client, or nothing was sent because it is gone or busy."""

    ANSWERED = "answered"
    GONE = "gone"
    BUSY = "busy"


async def forward(
    scope: Scope, receive: Receive, send: Send, target: Target, *, path: bytes | None = None
) -> Forwarded:
    """Send the request to ``target`` and its answer to the client (``ANSWERED``); ``GONE`` or ``BUSY``, with nothing
    sent, when the target cannot be reached. ``path``: another path than the client's (a gateway's process mount
    sends the path below it)."""
    body = await read_body(receive)
    headers = [
        (name, value) for name, value in scope["headers"] if name not in _HOP_BY_HOP and name != FORWARDED_HEADER
    ]
    host = next((value for name, value in scope["headers"] if name == b"host"), None)
    if host is not None and target[0] == "worker":
        headers.append((b"host", host))  # the same server, another process: the client's Host still names it
    headers.append((FORWARDED_HEADER, target[0].encode()))
    if path is None:
        path = CLIENT_PATH.get(scope) or scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string") or b""
    url = (path + (b"?" + query if query else b"")).decode("latin-1")
    client = _client(target)
    request = client.build_request(scope["method"], url, headers=headers, content=body)
    deadline = time.monotonic() + _PATIENCE_S
    pause = _RETRY_FIRST_S
    while True:
        try:
            response = await client.send(request, stream=True)
            break
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as error:
            outcome = Forwarded.GONE if _gone(target, error) else Forwarded.BUSY
            if outcome is Forwarded.GONE or time.monotonic() + pause > deadline:
                return _failed(target, outcome, error)
            await asyncio.sleep(pause)  # nothing was sent: the same request goes again
            pause = min(pause * 2, _RETRY_MOST_S)
        except httpx.TransportError as error:  # sent, and the owner went away before it answered
            return _failed(target, Forwarded.GONE, error)
    FORWARDED.set(scope, True)
    try:
        raw = [
            (name.lower(), value)
            for name, value in response.headers.raw
            if name.lower() not in _HOP_BY_HOP and name.lower() not in _SERVER_HEADERS
        ]
        if "content-length" in response.headers:  # the raw bytes go on as they came, encoded or not
            raw.append((b"content-length", response.headers["content-length"].encode()))
        await send({"type": "http.response.start", "status": response.status_code, "headers": raw})
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        await response.aclose()
    return Forwarded.ANSWERED


def _gone(target: Target, error: Exception) -> bool:
    """Whether the owner is no more (its socket missing, or refused), rather than too busy to accept."""
    kind, where = target
    if kind == "worker" and not os.path.exists(where):
        return True
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, _GONE_ERRORS):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _failed(target: Target, outcome: Forwarded, error: Exception) -> Forwarded:
    forward_failed(target[0], outcome.value)
    _warn("gymhost: could not forward a request to the %s at %s, which owns its session: %s (%s)",
          target[0], target[1], outcome.value, type(error).__name__)  # fmt: skip
    return outcome


def _client(target: Target) -> httpx.AsyncClient:
    """One kept-alive client per target and event loop."""
    key = (id(asyncio.get_running_loop()), target)
    client = _clients.get(key)
    if client is None or client.is_closed:
        kind, where = target
        timeout = httpx.Timeout(None, connect=_CONNECT_TIMEOUT_S)  # a tool call takes as long as it takes
        if kind == "worker":
            transport = httpx.AsyncHTTPTransport(uds=where, limits=_LIMITS)
            client = httpx.AsyncClient(transport=transport, base_url="http://gymhost-worker", timeout=timeout)
        else:
            client = httpx.AsyncClient(base_url=where, timeout=timeout, limits=_LIMITS)
        _clients[key] = client
    return client
