"""create_app on the example folders nemo-gym ships, driven in-process through httpx's ASGITransport."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from gymhost import EpisodeClient, HostedServer, create_app

from .gym_plays import PLAYS, example_rows, expected_reward

pytestmark = [pytest.mark.nemo_gym, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

BASE = "http://gymhost.test"


@asynccontextmanager
async def running(app: Any) -> AsyncIterator[httpx.ASGITransport]:
    """The app with its lifespan entered, as an ASGI server would run it."""
    async with app.router.lifespan_context(app):
        yield httpx.ASGITransport(app=app)


@pytest.mark.parametrize("example", sorted(PLAYS))
@pytest.mark.parametrize("right", [True, False], ids=["right", "wrong"])
async def test_example_rows_score_as_their_verifier_says(
    gym_root: Path, gym_version: tuple[int, ...], example: str, right: bool
) -> None:
    folder = gym_root / example
    app = create_app(folder)
    async with running(app) as transport:
        for row in example_rows(folder)[:3]:
            answer = await PLAYS[example](BASE, row, right, transport)
            assert answer["reward"] == expected_reward(example, right, gym_version)
            if gym_version >= (0, 7):
                assert answer["mask_sample"] is False


async def test_liveness_answers_before_any_session(gym_root: Path) -> None:
    """create_app's own liveness and readiness, whatever nemo-gym's version brings (0.4.0 has / alone)."""
    app = create_app(gym_root / "example_single_tool_call")
    async with running(app) as transport, httpx.AsyncClient(transport=transport, base_url=BASE) as client:
        for path in ("/", "/health", "/healthz", "/livez", "/readyz"):
            assert (await client.get(path)).json() == {"status": "ok"}, path


async def test_sessions_are_kept_apart_by_cookie(gym_root: Path) -> None:
    folder = gym_root / "example_session_state_mgmt"
    row = example_rows(folder)[0]
    app = create_app(folder)
    async with running(app) as transport:
        first, second = EpisodeClient(BASE, transport=transport), EpisodeClient(BASE, transport=transport)
        await first.seed(row)
        await second.seed(row)
        await first.call_tool("increment_counter", {"count": 100})
        counts = [json.loads((await e.call_tool("get_counter_value", {})).text)["count"] for e in (first, second)]
        assert counts == [row["initial_count"] + 100, row["initial_count"]]
        # A verify without the seed's cookie is a new session: the stateful server scores it 0.
        stranger = EpisodeClient(BASE, transport=transport)
        assert (await stranger.verify(row))["reward"] == 0.0


async def test_an_installed_servers_name_builds_it_as_serve_does() -> None:
    """``create_app("example_single_tool_call")``, as ``gymhost serve example_single_tool_call`` and
    ``GYMHOST_FOLDER`` take it; a name nemo-gym does not ship says so, with the nearest."""
    from gymhost import FolderError

    app = create_app("example_single_tool_call")
    assert app.state.gymhost.spec.folder.name == "example_single_tool_call"
    async with running(app) as transport:
        episode = EpisodeClient(BASE, transport=transport)
        row = {"responses_create_params": {"input": "Weather in SF?"}}
        await episode.seed(row)
        await episode.call_tool("get_weather", {"city": "SF"})
        assert (await episode.verify(row, "cold"))["reward"] == 1.0
    with pytest.raises(FolderError, match="did you mean example_single_tool_call"):
        create_app("example_single_tool_cal")


async def test_the_runtime_name_is_the_config_key_and_can_be_overridden(gym_root: Path) -> None:
    folder = gym_root / "example_session_state_mgmt"
    default = create_app(folder)
    renamed = create_app(folder, name="counter_b", host="10.0.0.7", port=9123)
    hosted: HostedServer = default.state.gymhost
    assert hosted.name == "example_session_state_mgmt_resources_server"
    assert hosted.spec.config_file.name == "example_session_state_mgmt.yaml"
    config = renamed.state.gymhost.server.config
    assert (config.name, config.host, config.port) == ("counter_b", "10.0.0.7", 9123)
    async with running(renamed) as transport:
        episode = EpisodeClient(BASE, transport=transport)
        await episode.seed(example_rows(folder)[0])
        assert list(episode.cookies) == ["StatefulCounterResourcesServer___counter_b"]


async def test_tool_validation_errors_stay_422(gym_root: Path) -> None:
    app = create_app(gym_root / "example_single_tool_call")
    async with running(app) as transport:
        episode = EpisodeClient(BASE, transport=transport)
        await episode.seed(example_rows(gym_root / "example_single_tool_call")[0])
        output = await episode.call_tool("get_weather", {"town": "x"})
        assert (output.ok, output.status_code) == (False, 422)
        assert json.loads(output.text)["detail"][0]["loc"] == ["body", "city"]


async def test_mcp_on_a_server_that_asks_for_it(gym_root: Path, gym_version: tuple[int, ...]) -> None:
    """0.4.0 wires MCP inside the class; 0.5+ only when the config says expose_tools_over_mcp."""
    app = create_app(gym_root / "example_mcp_weather")
    paths = {getattr(route, "path", None) for route in app.router.routes}
    assert "/mcp" in paths
    if gym_version >= (0, 5):
        assert app.state.gymhost.server.config.expose_tools_over_mcp is True
