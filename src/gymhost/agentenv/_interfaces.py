"""What the episode state machine (``_runtime``) needs of the pool and its instances, as protocols.

A server gives it ``_pool.Pool``, whose instances talk to environments through ``_env_client.EnvClient``; the unit
tests give it a fake pool whose instances answer in memory, to drive races between seeds, tool calls, verifies,
closes and expiry directly.
"""

from __future__ import annotations

from typing import Any, Protocol

from agentenv_protocol import ToolResult

from ._grading import Outcome
from ._outcomes import Failure

__all__ = ["EnvironmentClient", "InstancePool", "LeasedInstance", "ToolSession"]


class ToolSession(Protocol):
    """One MCP session on an instance (``_env_client.McpSession`` over HTTP, ``_direct.DirectToolSession`` on an
    in-process one)."""

    async def open(self) -> ToolSession: ...
    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult: ...
    async def list_tools(self) -> list[dict[str, Any]]: ...
    async def close(self) -> None: ...


class EnvironmentClient(Protocol):
    """What an episode asks of its instance (``_env_client.EnvClient``): to take on a task (once the pool has reset
    it), to open a tool session, and to grade what was done."""

    async def load(self, task: Any) -> None: ...
    def tool_session(self, card: dict[str, Any], *, role: str | None, timeout: float) -> ToolSession: ...
    async def grade(self, card: dict[str, Any], task: Any, final_text: str) -> Outcome: ...


class LeasedInstance(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def client(self) -> EnvironmentClient: ...


class InstancePool(Protocol):
    """The instances episodes are played on (``_pool.Pool``)."""

    card: dict[str, Any]
    hidden_tools: set[str]

    async def start(self) -> None: ...
    def begin_stop(self) -> None: ...
    async def stop(self) -> None: ...
    async def lease(self) -> LeasedInstance: ...
    async def release(self, instance: Any, failure: Failure | None) -> None: ...
    def status(self) -> dict[str, Any]: ...
    def not_ready(self) -> str | None: ...
    async def instance_status(self, index: int) -> dict[str, Any] | None: ...
