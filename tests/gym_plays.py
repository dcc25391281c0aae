"""Scripted plays of the example servers nemo-gym ships: a right one and a wrong one for each.

Each play takes a base URL and, for in-process tests, an ASGI transport, so the same play drives an app through
``httpx.ASGITransport`` and a real server process over TCP.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from gymhost import EpisodeClient

Play = Callable[[str, dict[str, Any], bool, httpx.AsyncBaseTransport | None], Awaitable[dict[str, Any]]]


def example_rows(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "data" / "example.jsonl").read_text().splitlines() if line.strip()]


async def play_single_tool_call(
    base_url: str, row: dict[str, Any], right: bool, transport: httpx.AsyncBaseTransport | None = None
) -> dict[str, Any]:
    """Right: call get_weather. Wrong: answer without calling it."""
    async with EpisodeClient(base_url, transport=transport) as episode:
        await episode.seed(row)
        if right:
            output = await episode.call_tool("get_weather", {"city": "San Francisco"})
            assert output.ok, output.text
            assert json.loads(output.text)["city"] == "San Francisco"
        return await episode.verify(row, "It is cold in San Francisco.")


async def play_session_state(
    base_url: str, row: dict[str, Any], right: bool, transport: httpx.AsyncBaseTransport | None = None
) -> dict[str, Any]:
    """Right: add exactly what takes the seeded counter to the expected count. Wrong: one more."""
    async with EpisodeClient(base_url, transport=transport) as episode:
        await episode.seed(row)
        step = row["expected_count"] - row["initial_count"] + (0 if right else 1)
        output = await episode.call_tool("increment_counter", {"count": step})
        assert output.ok, output.text
        count = json.loads((await episode.call_tool("get_counter_value", {})).text)["count"]
        assert count == row["initial_count"] + step
        return await episode.verify(row, f"The count is {count}.")


async def play_mcp_weather(
    base_url: str, row: dict[str, Any], right: bool, transport: httpx.AsyncBaseTransport | None = None
) -> dict[str, Any]:
    """Tools over the server's own ``/mcp``, as verifiers uses them when the seed answer carries ``mcp``.

    Right: the expected city, answered with the tool's sentence. Wrong: another city's weather.
    """
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    city = row["verifier_metadata"]["expected_city"] if right else "Atlantis"
    async with EpisodeClient(base_url, transport=transport) as episode:
        seeded = await episode.seed(row)
        mcp_meta = seeded["mcp"]
        mcp_url = f"{base_url.rstrip('/')}/{mcp_meta['url_path'].lstrip('/')}"
        async with (
            httpx.AsyncClient(transport=transport, headers=mcp_meta["headers"]) as http,
            streamable_http_client(mcp_url, http_client=http) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            listed = await session.list_tools()
            assert [tool.name for tool in listed.tools] == ["get_weather"]
            result = await session.call_tool("get_weather", {"city": city})
        assert not result.isError, result.content
        text = result.content[0].text  # type: ignore[union-attr]
        sentence = json.loads(text)["weather"] if text.startswith("{") else text  # 0.7.0 answers JSON
        episode.transcript.add_tool_call("get_weather", {"city": city}, _tool_output(text))
        return await episode.verify(row, sentence)


def _tool_output(text: str) -> Any:
    from gymhost import ToolOutput

    return ToolOutput(text=text, ok=True, status_code=200)


PLAYS: dict[str, Play] = {
    "example_single_tool_call": play_single_tool_call,
    "example_session_state_mgmt": play_session_state,
    "example_mcp_weather": play_mcp_weather,
}


def expected_reward(example: str, right: bool, gym_version: tuple[int, ...]) -> float:
    if right:
        return 1.0
    # nemo-gym 0.4.0's example_single_tool_call verifier is a stub that always answers 1.0.
    if example == "example_single_tool_call" and gym_version < (0, 5):
        return 1.0
    return 0.0
