"""One agentenv instance, as gymhost talks to it: card, data plane, extensions, MCP tools.

This is the only module that speaks the agentenv protocol on the wire, so a protocol release that moves something
is mended here. It keeps one HTTP client per instance, with its connections, for everything: the card, the data
plane, extensions and every episode's MCP session (the protocol package's helpers and ``ToolSession`` open a client
per call or per session). The client's transport can be an in-memory ASGI one, which is how in-process instances
are reached.

``McpSession`` is a small MCP client (streamable HTTP: initialize, tools/list with ``_meta``, tools/call, and a
DELETE to end the session), written here rather than taken from ``agentenv_protocol.ToolSession`` because that
one cannot share a client or use another transport, and drops ``_meta`` (where ``hiddenByDefault`` lives); nor
from ``mcp.ClientSession``, which costs a task group and memory streams per session.

Failures come out as kinds that mean different things to a grader: ``EnvUnavailableError`` (the instance did not
answer: down, unreachable; ``EnvTimeoutError`` when too slow), ``DataPlaneError`` (it answered with an error) and
``McpSessionError`` (the MCP session failed or is gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from agentenv_protocol import (
    HIDDEN_BY_DEFAULT_META_KEY,
    METHOD_ADD,
    METHOD_GET,
    METHOD_RESET,
    ROLE_HEADER,
    RPC_PATH,
    WELL_KNOWN_PATH,
    ToolResult,
)
from agentenv_protocol.client import ExtensionCallError, find_extension, find_extension_method, mcp_path

from ..._version import __version__
from .._backend import Catalog, ToolSession
from .._errors import (
    DataPlaneError,
    EnvDroppedError,
    EnvTimeoutError,
    EnvUnavailableError,
    ExtensionError,
    MalformedReplyError,
    McpMalformedReplyError,
    McpSessionError,
)
from .._grading import Asked, Observation, merge_state
from .._tasks import Seed
from ._grader import observe

__all__ = ["MCP_PROTOCOL_VERSION", "EnvClient", "McpSession"]

MCP_PROTOCOL_VERSION = "2025-11-25"  # what this client speaks, and what direct calls answer (``_direct``)
# The connection was there and went away during the call (ConnectError, by contrast, means nobody answered).
_DROPPED = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
_CLOSE_TIMEOUT_S = 5.0


class EnvClient:
    def __init__(
        self,
        base_url: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        data_timeout: float,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.base_url, transport=transport, timeout=data_timeout)

    async def describe(self) -> Catalog:
        """The instance's card, read as the bridge reads an environment."""
        card = await self.card()
        tools = tuple(tool for tool in (card.get("capabilities") or {}).get("tools") or [] if isinstance(tool, dict))
        return Catalog(str(card["name"]), tools, card=card)

    async def card(self) -> dict[str, Any]:
        response = await self._send("GET", WELL_KNOWN_PATH)
        if response.status_code != 200:
            raise MalformedReplyError(
                f"{self.base_url}{WELL_KNOWN_PATH} answered HTTP {response.status_code}, not a card"
            )
        try:
            card: dict[str, Any] = response.json()
        except ValueError:
            raise MalformedReplyError(f"{self.base_url}{WELL_KNOWN_PATH} answered something that is not JSON") from None
        if not isinstance(card, dict) or not isinstance(card.get("name"), str):
            raise MalformedReplyError(f"{self.base_url}{WELL_KNOWN_PATH} answered JSON that is not an environment card")
        return card

    async def clear(self) -> None:
        """``data/reset``: the state an instance starts in."""
        await self._rpc(METHOD_RESET, {})

    async def begin(self, seed: Seed) -> None:
        """A task's seed data, in one ``data/add`` after the pool's ``data/reset`` (none: the reset state)."""
        if seed.parts:
            await self.add([part.model_dump(mode="json", exclude_none=True) for part in seed.parts])

    async def observe(self, catalog: Catalog, asked: Asked, final_text: str) -> Observation:
        return await observe(self, catalog, asked)

    async def add(self, parts: list[dict[str, Any]]) -> None:
        await self._rpc(METHOD_ADD, {"parts": parts})

    async def get(self) -> list[dict[str, Any]]:
        result = await self._rpc(METHOD_GET, {})
        parts = result.get("parts")
        if not isinstance(parts, list):
            raise MalformedReplyError(f"{self.base_url}: data/get answered no parts list")
        return parts

    async def state(self) -> dict[str, Any]:
        """``data/get``'s parts merged into one state (the pool view's ``data``)."""
        return merge_state(await self.get())

    async def call_extension(self, catalog: Catalog, uri: str, method: str | None, params: dict[str, Any]) -> Any:
        """Invoke an extension method the card advertises (the protocol's ``invoke_extension``, on this client)."""
        card = dict(catalog.card)
        extension = find_extension(card, uri)
        if extension is None:
            raise ExtensionError(f"the environment's card advertises no extension {uri}")
        advertised = extension.get("params") or {}
        name = method or next(iter(advertised.get("methods") or {}), None)
        operation = find_extension_method(card, uri, name) if name else None
        if operation is None or not operation.get("endpoint"):
            raise ExtensionError(f"extension {uri} advertises no method {name!r} with an endpoint")
        if operation["method"] == "GET":
            response = await self._send("GET", operation["endpoint"], params=params)
        else:
            response = await self._send(operation["method"], operation["endpoint"], json=params)
        if response.status_code >= 400:
            error = ExtensionCallError(response)
            raise ExtensionError(f"extension {uri} answered {error}")
        try:
            return response.json()
        except ValueError:
            raise ExtensionError(f"extension {uri} answered something that is not JSON") from None

    def mcp_url(self, catalog: Catalog) -> str:
        return f"{self.base_url}{mcp_path(dict(catalog.card))}"

    def tool_session(self, catalog: Catalog, *, role: str | None, timeout: float) -> ToolSession:
        """An MCP session on this instance (not yet opened), over this instance's client."""
        return McpSession(self._http, mcp_path(dict(catalog.card)), role=role, timeout=timeout)

    async def hidden_tools(self, catalog: Catalog) -> set[str]:
        """Names ``tools/list`` marks hidden by default: plumbing a task drives, never the policy's to call."""
        session = self.tool_session(catalog, role=None, timeout=self._http.timeout.read or 30.0)
        try:
            await session.open()
            tools = await session.list_tools()
        except McpSessionError as error:
            raise EnvUnavailableError(f"{self.mcp_url(catalog)}: tools/list failed: {error}") from error
        finally:
            await session.close()
        return {tool["name"] for tool in tools if (tool.get("_meta") or {}).get(HIDDEN_BY_DEFAULT_META_KEY)}

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _rpc(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        response = await self._send(
            "POST", RPC_PATH, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        )
        if response.status_code != 200:
            raise MalformedReplyError(f"{self.base_url}: {method} answered HTTP {response.status_code}")
        try:
            body = response.json()
        except ValueError:
            raise MalformedReplyError(f"{self.base_url}: {method} answered something that is not JSON") from None
        if not isinstance(body, dict):
            raise MalformedReplyError(f"{self.base_url}: {method} answered JSON that is not a JSON-RPC object")
        if "error" in body:
            error = body["error"]
            if not isinstance(error, dict):
                raise MalformedReplyError(f"{self.base_url}: {method} answered an error that is not a JSON-RPC error")
            detail = error.get("data") or {}
            code = detail.get("code") if isinstance(detail, dict) else None
            raise DataPlaneError(
                f"{self.base_url}: {method} failed: {error.get('message')} ({code or error.get('code')})"
            )
        result = body.get("result")
        if not isinstance(result, dict):
            raise MalformedReplyError(f"{self.base_url}: {method} answered no result object")
        return result

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as error:
            raise EnvTimeoutError(f"{self.base_url}{path}: no answer in time ({type(error).__name__})") from error
        except _DROPPED as error:
            raise EnvDroppedError(f"{self.base_url}{path}: the connection dropped mid-call: {error!r}") from error
        except httpx.TransportError as error:
            raise EnvUnavailableError(f"{self.base_url}{path}: {error!r}") from error


class McpSession:
    """One MCP session on an instance. Use it on the event loop that opened it; nothing is retried."""

    def __init__(self, http: httpx.AsyncClient, path: str, *, role: str | None, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self.session_id: str | None = None
        self._http = http
        self._headers = {"Accept": "application/json, text/event-stream", **({ROLE_HEADER: role} if role else {})}
        self._ids = itertools.count(1)

    async def open(self) -> McpSession:
        result = await self._request(
            "initialize",
            {
                "protocolVersion": MCP_PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "gymhost", "version": __version__},
            },
        )
        self._headers["MCP-Protocol-Version"] = str(result.get("protocolVersion") or MCP_PROTOCOL_VERSION)
        await self._exchange({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return self

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        result = await self._request("tools/call", {"name": name, "arguments": arguments})
        try:
            return ToolResult.model_validate(result)
        except ValueError as error:
            raise McpMalformedReplyError(f"tools/call {name}: unreadable result: {error}") from None

    async def list_tools(self) -> list[dict[str, Any]]:
        """Every tool with its ``_meta``, across pages."""
        tools: list[dict[str, Any]] = []
        params: dict[str, Any] = {}
        while True:
            result = await self._request("tools/list", params)
            tools += [tool for tool in result.get("tools") or [] if isinstance(tool, dict)]
            if not result.get("nextCursor"):
                return tools
            params = {"cursor": result["nextCursor"]}

    async def close(self) -> None:
        """End the session on the server (at most 5 s); a server that is already gone is not an error."""
        if self.session_id is None:
            return
        headers, self.session_id = self._session_headers(), None
        with contextlib.suppress(httpx.HTTPError, TimeoutError):
            await asyncio.wait_for(self._http.delete(self.path, headers=headers), min(self.timeout, _CLOSE_TIMEOUT_S))

    async def _request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        reply = await self._exchange({"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params})
        if "error" in reply:
            error = reply["error"] if isinstance(reply["error"], dict) else {"message": reply["error"]}
            raise McpSessionError(f"{method} failed: {error.get('message')} (code {error.get('code')})")
        result = reply.get("result")
        if not isinstance(result, dict):
            raise McpMalformedReplyError(f"{method}: the reply has no result object")
        return result

    async def _exchange(self, message: dict[str, Any]) -> dict[str, Any]:
        method = message["method"]
        try:
            return await asyncio.wait_for(self._post(message), self.timeout)
        except (TimeoutError, httpx.TimeoutException):
            raise EnvTimeoutError(f"MCP {method} did not answer within {self.timeout:g}s") from None
        except _DROPPED as error:
            raise EnvDroppedError(f"MCP {method}: the connection dropped mid-call: {error!r}") from error
        except httpx.TransportError as error:
            raise EnvUnavailableError(f"MCP {method}: {error!r}") from error

    async def _post(self, message: dict[str, Any]) -> dict[str, Any]:
        method = message["method"]
        headers = self._session_headers()
        async with self._http.stream(
            "POST", self.path, json=message, headers=headers, timeout=self.timeout
        ) as response:
            if response.status_code == 404 and self.session_id:
                raise McpSessionError(f"{method}: the server no longer knows MCP session {self.session_id}")
            if response.status_code >= 400:
                body = (await response.aread()).decode(errors="replace")[:500]
                raise McpMalformedReplyError(f"{method}: HTTP {response.status_code}: {body}")
            if method == "initialize":
                self.session_id = response.headers.get("mcp-session-id")
            if "id" not in message:
                return {}
            content_type = response.headers.get("content-type", "")
            try:
                if content_type.startswith("text/event-stream"):
                    async for data in _sse_messages(response):
                        reply = json.loads(data)
                        if isinstance(reply, dict) and reply.get("id") == message["id"]:
                            return reply
                    raise McpMalformedReplyError(f"{method}: the event stream ended before the reply")
                reply = json.loads((await response.aread()).decode())  # UTF-8, as JSON is: no encoding guessed
            except ValueError as error:
                raise McpMalformedReplyError(f"{method}: the reply is not JSON: {error}") from None
            if not isinstance(reply, dict):
                raise McpMalformedReplyError(f"{method}: the reply is not a JSON-RPC object")
            return reply

    def _session_headers(self) -> dict[str, str]:
        return {**self._headers, "mcp-session-id": self.session_id} if self.session_id else self._headers


async def _sse_messages(response: httpx.Response) -> AsyncIterator[str]:
    """The data of each ``message`` event of a server-sent event stream."""
    event, data = "message", list[str]()
    async for line in response.aiter_lines():
        if not line:
            if data and event == "message":
                yield "\n".join(data)
            event, data = "message", []
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
