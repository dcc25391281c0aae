"""A rehearsal, in the template, of what each instance runs as it starts and plays, on an environment of gymhost's own.

Code CPython runs for the first time costs more than it does afterwards: its bytecode is specialized (written in
place), type and attribute caches are filled, version tags assigned, validators and lazy tables built. An instance
forked from a template that never ran its serving path does all of that itself, on pages it then copies from the
template, and every instance does it again. ``rehearse`` runs that path once in the template on ``_Rehearsal``, a
small environment of gymhost's own: an app hosted in memory with its lifespan, a reset, the card read, data added and
read back, a tool session opened, listed, called and closed (agentenv's data plane and tool dispatch, FastMCP's and
mcp's validation, gymhost's in-memory calls and direct tool sessions), so the instances start warm. Measured by hand
(``benchmarks/README.md``, "What made it fast"): a tenth fewer page faults an instance, and 5 to 10% less of its CPU
from fork to an episode's end.

Only gymhost's own environment runs here, never the bundle's: the bundle's code runs in the template only where
``_construct_once`` found it safe, and only its constructor. The rehearsal reaches nothing outside the process (no
file, socket, thread or process; ``tests/test_rehearsal_unit.py``) and runs on asyncio's own selector loop, whatever
loop policy the bundle set: uvloop's first loop opens a process-wide pipe (libuv's signal lock) that a fork by
``clone3``, which runs no ``atfork`` handler, would leave shared by every instance. Each play is bounded
(``_PLAY_S``): a template held up here would answer no spawn.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from agentenv_protocol import AgentEnvEnvironment, DataPart, add_data, environment_card, get_data, reset_data, tool

from ._channel import _to_server
from ._launchers import NO_NETWORK_TIMEOUT_S, InProcessClient, construct, host_in_process, stop_in_process

__all__ = ["rehearse"]

_PLAYS = 3  # CPython specializes an instruction on its second run or so: a few plays warm the whole path
_PLAY_S = 5.0  # one play takes tens of milliseconds; past this something the bundle's import changed holds it up


@environment_card(name="gymhost-rehearsal")
class _Rehearsal(AgentEnvEnvironment):
    def __init__(self) -> None:
        self.parts: list[Any] = []

    @reset_data
    async def reset(self) -> None:
        self.parts = []

    @add_data
    async def add(self, parts: list[Any]) -> None:
        self.parts = list(parts)

    @get_data
    async def get(self) -> list[DataPart]:
        return [DataPart(data={"parts": len(self.parts)})]

    @tool(name="{environment_name}_echo")
    async def echo(self, text: str) -> dict[str, Any]:
        """Answers what it is given."""
        return {"text": text}


def rehearse() -> None:
    """Play ``_Rehearsal`` through a few times, each on an asyncio event loop of its own (whatever loop policy the
    bundle's import set), as an instance plays; what goes wrong ends it, raised."""
    for _ in range(_PLAYS):
        asyncio.run(_play(), loop_factory=asyncio.SelectorEventLoop)


async def _play() -> None:
    async with asyncio.timeout(_PLAY_S):
        instance = await host_in_process(construct(_Rehearsal), 0, NO_NETWORK_TIMEOUT_S)
        client = cast(InProcessClient, instance.client)
        try:
            await client.clear()
            catalog = await client.describe()
            await client.add([{"kind": "data", "data": {"rehearsal": True}}])
            session = client.tool_session(catalog, role=None, timeout=_PLAY_S)
            await session.open()
            tools = await session.list_tools()  # named by the card, which ENVIRONMENT_NAME may rename
            answer = await session.call_tool(tools[0]["name"], {"text": "rehearsal"})
            await session.close()
            answered = [(1, True, value) for value in (answer, (catalog, True), tools, await client.state())]
            _to_server(answered)  # as an instance writes its answers to the server
        finally:
            await stop_in_process(instance)
    if answer.isError:
        raise RuntimeError(f"the rehearsal's tool call answered an error: {answer.content!r}")
