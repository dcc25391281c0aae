"""One agent-environment instance, as gymhost talks to it: card, data plane, extensions, MCP tools.

This is the only module that speaks the agentenv protocol on the wire, so a protocol release that moves something
is mended here. It keeps one HTTP client per instance (the protocol package's helpers open one per call), which
matters when every episode makes several data-plane calls. Tool calls go through the protocol package's
``ToolSession``, and so does listing tools with their ``_meta`` (where ``hiddenByDefault`` lives).

Failures come out as two kinds, because they mean different things to a grader: ``EnvUnavailableError`` (the
instance did not answer: down, unreachable, too slow) and ``DataPlaneError`` (it answered with an error).
"""

from __future__ import annotations

from typing import Any

import httpx
from agentenv_protocol import (
    HIDDEN_BY_DEFAULT_META_KEY,
    METHOD_ADD,
    METHOD_GET,
    METHOD_RESET,
    RPC_PATH,
    WELL_KNOWN_PATH,
    ToolSession,
    ToolSessionError,
)
from agentenv_protocol.client import ExtensionCallError, find_extension, find_extension_method, mcp_path

from .._exceptions import GymhostError

__all__ = ["DataPlaneError", "EnvClient", "EnvTimeoutError", "EnvUnavailableError", "ExtensionError"]


class EnvUnavailableError(GymhostError):
    """The instance did not answer: connection refused or dropped, or too slow."""


class EnvTimeoutError(EnvUnavailableError):
    """The instance took longer than the timeout to answer."""


class DataPlaneError(GymhostError):
    """The instance answered a data-plane call (or the card) with an error."""


class ExtensionError(GymhostError):
    """A card extension could not be called, or answered an error."""


class EnvClient:
    def __init__(
        self,
        base_url: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        data_timeout: float = 30.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.base_url, transport=transport, timeout=data_timeout)

    async def card(self) -> dict[str, Any]:
        response = await self._send("GET", WELL_KNOWN_PATH)
        if response.status_code != 200:
            raise DataPlaneError(f"{self.base_url}{WELL_KNOWN_PATH} answered HTTP {response.status_code}, not a card")
        try:
            card: dict[str, Any] = response.json()
        except ValueError:
            raise DataPlaneError(f"{self.base_url}{WELL_KNOWN_PATH} answered something that is not JSON") from None
        if not isinstance(card, dict) or not isinstance(card.get("name"), str):
            raise DataPlaneError(f"{self.base_url}{WELL_KNOWN_PATH} answered JSON that is not an environment card")
        return card

    async def reset(self) -> None:
        await self._rpc(METHOD_RESET, {})

    async def add(self, parts: list[dict[str, Any]]) -> None:
        await self._rpc(METHOD_ADD, {"parts": parts})

    async def get(self) -> list[dict[str, Any]]:
        result = await self._rpc(METHOD_GET, {})
        parts = result.get("parts")
        if not isinstance(parts, list):
            raise DataPlaneError(f"{self.base_url}: data/get answered no parts list")
        return parts

    async def call_extension(self, card: dict[str, Any], uri: str, method: str | None, params: dict[str, Any]) -> Any:
        """Invoke an extension method the card advertises (the protocol's ``invoke_extension``, on this client)."""
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

    def mcp_url(self, card: dict[str, Any]) -> str:
        return f"{self.base_url}{mcp_path(card)}"

    def tool_session(self, card: dict[str, Any], *, role: str | None, timeout: float) -> ToolSession:
        return ToolSession(mcp_url=self.mcp_url(card), role=role, timeout=timeout)

    async def hidden_tools(self, card: dict[str, Any]) -> set[str]:
        """Names ``tools/list`` marks hidden by default: plumbing a task drives, never the policy's to call."""
        try:
            async with _ListingSession(mcp_url=self.mcp_url(card), timeout=self._http.timeout.read or 30.0) as session:
                tools = await session.list_tools_with_meta()
        except (ToolSessionError, TimeoutError, httpx.HTTPError) as error:
            raise EnvUnavailableError(f"{self.mcp_url(card)}: tools/list failed: {error!r}") from error
        return {tool["name"] for tool in tools if (tool.get("_meta") or {}).get(HIDDEN_BY_DEFAULT_META_KEY)}

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _rpc(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        response = await self._send(
            "POST", RPC_PATH, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        )
        if response.status_code != 200:
            raise DataPlaneError(f"{self.base_url}: {method} answered HTTP {response.status_code}")
        try:
            body = response.json()
        except ValueError:
            raise DataPlaneError(f"{self.base_url}: {method} answered something that is not JSON") from None
        if "error" in body:
            error = body["error"] or {}
            detail = error.get("data") or {}
            code = detail.get("code") if isinstance(detail, dict) else None
            raise DataPlaneError(
                f"{self.base_url}: {method} failed: {error.get('message')} ({code or error.get('code')})"
            )
        result = body.get("result")
        if not isinstance(result, dict):
            raise DataPlaneError(f"{self.base_url}: {method} answered no result object")
        return result

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as error:
            raise EnvTimeoutError(f"{self.base_url}{path}: no answer in time ({type(error).__name__})") from error
        except httpx.TransportError as error:
            raise EnvUnavailableError(f"{self.base_url}{path}: {error!r}") from error


class _ListingSession(ToolSession):  # type: ignore[misc]
    """``ToolSession`` whose tool listing keeps ``_meta``.

    ``ToolSession.list_tools`` validates each tool into ``EnvironmentTool``, which has no ``_meta``, so the hidden
    marker is lost; this uses the session's own request method (a private one, hence pinned to
    agentenv-framework-protocol < 0.2 and covered by a test) to read the raw listing.
    """

    async def list_tools_with_meta(self) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        params: dict[str, Any] = {}
        while True:
            result = await self._request("tools/list", params)
            tools += [tool for tool in result.get("tools") or [] if isinstance(tool, dict)]
            if not result.get("nextCursor"):
                return tools
            params = {"cursor": result["nextCursor"]}
