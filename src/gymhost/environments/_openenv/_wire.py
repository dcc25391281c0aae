"""One OpenEnv session on the wire (``/ws``): one JSON text frame in, one out, and what the frames carried.

Errors come as ``{"type": "error", "data": {"message", "code"}}`` and keep the session open, except
``CAPACITY_REACHED``, which the server sends right after the upgrade and then closes; ``close`` gets no reply (the
server closes the socket once it has freed the session's slot). The client and the launcher (``_client``) build on
this; checked against ``openenv`` 0.10.0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from .._backend import Catalog
from .._errors import EnvDroppedError, EnvTimeoutError, MalformedReplyError

__all__ = ["Session", "Tally", "environment_error", "listed_tools", "openenv_catalog"]

# openenv's own client takes frames of up to 100 MB; a tool's result can be large (a file, a screenshot).
MAX_FRAME_BYTES = 100 * 2**20
CLOSE_TIMEOUT_S = 5.0


def openenv_catalog(environment: str, tools: list[dict[str, Any]]) -> Catalog:
    """An OpenEnv environment as the bridge reads one: its name and its tools (``list_tools``' ``input_schema`` as
    MCP's ``inputSchema``). OpenEnv has no hidden tools."""
    listed = tuple(
        {
            "name": tool.get("name"),
            "description": tool.get("description") or "",
            "inputSchema": tool.get("input_schema") or tool.get("inputSchema") or {"type": "object"},
        }
        for tool in tools
        if isinstance(tool, dict)
    )
    return Catalog(environment, listed)


@dataclass
class Tally:
    """What one session has given so far: the rewards of its reset and steps, whether it said done, and the system
    prompt of its current turn (the model is told when a later turn changes it)."""

    rewards: list[float] = field(default_factory=list)
    steps: int = 0
    done: bool = False
    system_prompt: str | None = None

    def add(self, data: dict[str, Any]) -> None:
        reward = data.get("reward")
        if isinstance(reward, bool | int | float):
            self.rewards.append(float(reward))
        self.done = self.done or bool(data.get("done"))


def environment_error(data: dict[str, Any]) -> str | None:
    """The environment's own error, when an observation says the episode cannot go on (``metadata.status`` is
    ``"error"``, as agent-env answers a deploy, a run or a reward that failed): its ``metadata.error`` text."""
    observation = data.get("observation")
    for metadata in (data.get("metadata"), observation.get("metadata") if isinstance(observation, dict) else None):
        if isinstance(metadata, dict) and metadata.get("status") == "error":
            return str(metadata.get("error") or "the environment reported an error and gave no reason")
    return None


class Session:
    """One OpenEnv session: a WebSocket, one request and its one reply at a time.

    An exchange runs in a task of its own that the caller only awaits, so a caller cancelled mid-exchange (a client
    that hung up) leaves the reply to be read, not to be taken for the answer to the next request. One whose reply
    does not come in time leaves the socket out of step, so the session is cut.
    """

    def __init__(self, connection: ClientConnection, url: str) -> None:
        self.connection = connection
        self.url = url
        self._lock = asyncio.Lock()

    @property
    def closed(self) -> bool:
        return self.connection.close_code is not None

    async def request(self, message: dict[str, Any], timeout: float, what: str) -> dict[str, Any]:
        return await asyncio.shield(asyncio.ensure_future(self._exchange(message, timeout, what)))

    async def _exchange(self, message: dict[str, Any], timeout: float, what: str) -> dict[str, Any]:
        async with self._lock:
            with contextlib.suppress(ConnectionClosed):  # a refusal sent before the close is still there to read
                await self.connection.send(json.dumps(message))
            try:
                async with asyncio.timeout(timeout):
                    frame = await self.connection.recv()
            except TimeoutError:
                await self.abort()
                raise EnvTimeoutError(f"{self.url}: {what}: no answer in {timeout:g}s") from None
            except ConnectionClosed as error:
                raise EnvDroppedError(f"{self.url}: {what}: the session's connection closed: {error}") from None
        try:
            reply = json.loads(frame)
        except (TypeError, ValueError):
            raise MalformedReplyError(f"{self.url}: {what}: the reply is not JSON text") from None
        if not isinstance(reply, dict) or not isinstance(reply.get("data"), dict):
            raise MalformedReplyError(f"{self.url}: {what}: the reply has no data object: {frame!r:.200}")
        return reply

    async def close(self) -> None:
        """End the session: ``close``, then wait for the server to close the socket, which it does once the
        session's slot is free again (so the next episode's session is not refused for capacity)."""
        with contextlib.suppress(ConnectionClosed, OSError):
            await self.connection.send(json.dumps({"type": "close"}))
        with contextlib.suppress(TimeoutError, OSError):
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self.connection.wait_closed()
        await self.abort()

    async def abort(self) -> None:
        with contextlib.suppress(Exception):
            await self.connection.close()


def listed_tools(reply: dict[str, Any], url: str) -> list[dict[str, Any]] | None:
    """The tools a ``list_tools`` observation lists; none (``[]``) when it answers that the environment has none
    before a reset, None when it is no ``list_tools`` answer at all."""
    if reply.get("type") != "observation":
        return None
    data = reply["data"]
    observation = data.get("observation")
    tools = observation.get("tools") if isinstance(observation, dict) else None
    if isinstance(tools, list):
        return [tool for tool in tools if isinstance(tool, dict)]
    if environment_error(data) is not None or data.get("done"):
        return []
    raise MalformedReplyError(f"{url}: list_tools answered no tools: {json.dumps(reply)[:200]}")
