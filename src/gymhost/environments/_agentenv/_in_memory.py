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
import re
from collections.abc import Mapping
from typing import Any

import httpx

__all__ = ["request"]

_CLIENT = ("127.0.0.1", 123)  # the peer httpx's ASGI transport reports
_JSON = b"application/json"
_PLAIN = re.compile(r"[A-Za-z0-9/._~-]*")  # a path httpx would send as it is, with no query


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
    as its body, ``params`` in its query, as the installed httpx puts them there); what the app raises is raised
    here, as that transport raises it. An error's answer (400 and above) carries the request it answers, as
    agentenv's ``ExtensionCallError`` reads it; any other carries none (``EnvClient`` reads status and body only)."""
    host = base_url.partition("://")[2].partition("/")[0]
    if params is None and _PLAIN.fullmatch(path):  # the card's and the data plane's paths: nothing to encode
        decoded, raw_path, query = path, path.encode("ascii"), b""
    else:
        url = httpx.Request(method, f"{base_url}{path}", params=params).url
        decoded, raw_path, query = url.path, url.raw_path.partition(b"?")[0], url.query
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
        "path": decoded,
        "raw_path": raw_path,
        "query_string": query,
        "server": (host, None),
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
    sent = httpx.Request(method, f"{base_url}{raw_path.decode('ascii')}", params=query.decode("ascii"), content=body)
    return httpx.Response(status, headers=response_headers, content=b"".join(parts), request=sent)
