"""Forwarding a request to the process that owns its session, and its answer back, unchanged.

With several worker processes on one host (``gymhost serve --workers N``), the kernel hands each new connection to
whichever worker accepts it, and verifiers opens a new connection for every request: most calls of an episode reach
a worker that does not hold it. That worker reads the owner from the signed session (or MCP token) and forwards the
request over the owner's Unix socket; across hosts, to the URL the owning replica advertised. The request goes as it
came (method, path with any mount and ``/ng-rollout/<id>`` prefix, query, headers, body) and the owner's answer
streams back as it is, status, headers and body, event streams included.

A header marks a forwarded request, so it is forwarded at most once more and never in a loop: a request forwarded
from another replica may still go on to the right worker of this one; a request forwarded from a sibling worker is
answered where it lands. An owner that cannot be reached is reported to the caller (``forward`` returns False) and
answered as a lost session.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from starlette.types import Receive, Scope, Send

from ._process import Target

__all__ = ["FORWARDED_HEADER", "FORWARDED_SCOPE_KEY", "ORIGINAL_PATH_SCOPE_KEY", "forward", "may_forward", "read_body"]

FORWARDED_HEADER = b"x-gymhost-forwarded"  # "replica" or "worker": the hop the request came by
FORWARDED_SCOPE_KEY = "gymhost.forwarded"  # set on a request whose answer is another process's
ORIGINAL_PATH_SCOPE_KEY = "gymhost.raw_path"  # the path as the client sent it, before a rollout prefix was taken off
_HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade", b"content-length", b"host"}
)
# The server in front adds its own: the owner's would be sent twice.
_SERVER_HEADERS = frozenset({b"date", b"server"})
_CONNECT_TIMEOUT_S = 5.0
_clients: dict[tuple[int, Target], httpx.AsyncClient] = {}


def may_forward(scope: Scope, target: Target) -> bool:
    """A request goes at most one hop further, and only from a replica to one of its workers."""
    hop = next((value for name, value in scope["headers"] if name == FORWARDED_HEADER), None)
    return hop is None or (hop == b"replica" and target[0] == "worker")


async def forward(scope: Scope, receive: Receive, send: Send, target: Target, *, path: bytes | None = None) -> bool:
    """Send the request to ``target`` and its answer to the client; False, with nothing sent, when the target cannot
    be reached. ``path``: another path than the client's (a gateway's process mount sends the path below it)."""
    body = await read_body(receive)
    headers = [
        (name, value) for name, value in scope["headers"] if name not in _HOP_BY_HOP and name != FORWARDED_HEADER
    ]
    host = next((value for name, value in scope["headers"] if name == b"host"), None)
    if host is not None and target[0] == "worker":
        headers.append((b"host", host))  # the same server, another process: the client's Host still names it
    headers.append((FORWARDED_HEADER, target[0].encode()))
    if path is None:
        path = scope.get(ORIGINAL_PATH_SCOPE_KEY) or scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string") or b""
    url = (path + (b"?" + query if query else b"")).decode("latin-1")
    client = _client(target)
    request = client.build_request(scope["method"], url, headers=headers, content=body)
    try:
        response = await client.send(request, stream=True)
    except httpx.TransportError:
        return False
    scope[FORWARDED_SCOPE_KEY] = True
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
    return True


def _client(target: Target) -> httpx.AsyncClient:
    """One kept-alive client per target and event loop."""
    key = (id(asyncio.get_running_loop()), target)
    client = _clients.get(key)
    if client is None or client.is_closed:
        kind, where = target
        timeout = httpx.Timeout(None, connect=_CONNECT_TIMEOUT_S)  # a tool call takes as long as it takes
        if kind == "worker":
            transport = httpx.AsyncHTTPTransport(uds=where)
            client = httpx.AsyncClient(transport=transport, base_url="http://gymhost-worker", timeout=timeout)
        else:
            client = httpx.AsyncClient(base_url=where, timeout=timeout)
        _clients[key] = client
    return client


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message: Any = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)
