"""An in-process instance's card and data plane, its app called as ASGI with no HTTP client in between.

An in-process instance, and every instance process (which runs its environment the same way), answers its card, its
data plane and its extensions from its Starlette app. Called through httpx's client over httpx's ASGI transport, a
``data/reset`` cost about 190 µs of CPU hot, of which the app's own work is about 20: the rest is the client's
(a URL parsed and merged twice, a cookie jar read and written, auth and redirect steps), none of which an in-memory
call has a use for. In a freshly forked instance, where every object a call touches is a page the kernel copies, it
cost more (the reset an instance starts with, 750 µs). ``request`` builds the scope httpx's transport builds and
calls the app itself, about 35 µs hot (``benchmarks/README.md``, "Process mode"), and answers an ``httpx.Response``,
so ``EnvClient`` reads it as it reads one from the network.
"""

from __future__ import annotations

import asyncio
import json as jsonlib
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

import httpx

__all__ = ["request"]

_CLIENT = ("127.0.0.1", 123)  # the peer httpx's ASGI transport reports
_JSON = b"application/json"


async def request(
    app: Any,
    base_url: str,
    method: str,
    path: str,
    *,
    json: Any = None,
    params: Mapping[str, Any] | None = None,
) -> httpx.Response:
    """``method path`` on ``app``, as an ``httpx.AsyncClient`` over ``httpx.ASGITransport`` would send it (``json``
    as its body, ``params`` in its query); what the app raises is raised here, as that transport raises it."""
    path, _, query = path.partition("?")
    if params:
        query = "&".join(part for part in (query, str(httpx.QueryParams(params))) if part)
    host = base_url.partition("://")[2].partition("/")[0]
    headers = [(b"host", host.encode("ascii"))]
    body = b""
    if json is not None:
        body = jsonlib.dumps(json, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        headers += [(b"content-length", str(len(body)).encode("ascii")), (b"content-type", _JSON)]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "headers": headers,
        "scheme": "http",
        "path": unquote(path),
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "server": (host, 80),
        "client": _CLIENT,
        "root_path": "",
    }
    status: int | None = None
    response_headers: list[tuple[bytes, bytes]] = []
    parts: list[bytes] = []
    answered = asyncio.Event()
    unread = True

    async def receive() -> dict[str, Any]:
        nonlocal unread
        if unread:
            unread = False
            return {"type": "http.request", "body": body, "more_body": False}
        await answered.wait()  # nothing more to read: the client "leaves" once it has its answer
        return {"type": "http.disconnect"}

    async def send(message: Mapping[str, Any]) -> None:
        nonlocal status, response_headers
        if message["type"] == "http.response.start":
            status, response_headers = message["status"], list(message.get("headers", ()))
        elif message["type"] == "http.response.body":
            if message.get("body") and method != "HEAD":
                parts.append(message["body"])
            if not message.get("more_body", False):
                answered.set()

    await app(scope, receive, send)
    if status is None or not answered.is_set():
        raise RuntimeError(f"{method} {path}: the app returned without a complete answer")
    if status < 400:
        return httpx.Response(status, headers=response_headers, content=b"".join(parts))
    # An error's readers (agentenv's ExtensionCallError) ask for the request it answers.
    sent = httpx.Request(method, f"{base_url}{path}", params=query, content=body)
    return httpx.Response(status, headers=response_headers, content=b"".join(parts), request=sent)
