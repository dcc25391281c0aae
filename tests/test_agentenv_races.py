"""Episodes under pressure: closes, repeated seeds and disconnects racing a seed; bodies that echo answer fields."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from gymhost import EpisodeClient
from gymhost.environments import write_folder

from .agentenv_helpers import COUNTER_TASK, make_bundle, rows, served, settled_pool
from .processes import gymhost_command, run_to_completion, serving

pytestmark = [pytest.mark.nemo_gym, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

BASE = "http://gymhost.test"
SLOW = {**COUNTER_TASK, "id": "slow", "seed": {"parts": [{"kind": "data", "data": {"start": 100, "slow": 1.0}}]}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("races")
    return write_folder(str(make_bundle(root, tasks=[COUNTER_TASK, SLOW])), root / "root", instances=1).path


def row(folder: Path, task_id: str) -> dict[str, Any]:
    return next(r for r in rows(folder) if r["task_id"] == task_id)


async def status(transport: httpx.AsyncBaseTransport) -> dict[str, Any]:
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
        answer: dict[str, Any] = (await client.get("/agentenv/pool")).json()
        return answer


async def play(transport: httpx.AsyncBaseTransport, the_row: dict[str, Any]) -> dict[str, Any]:
    async with EpisodeClient(BASE, transport=transport) as episode:
        await episode.seed(the_row)
        await episode.call_tool("increment", {"by": 2})
        return await episode.verify(the_row)


async def test_a_close_during_a_seed_waits_for_it_and_leaks_nothing(folder: Path) -> None:
    async with served(folder) as transport, httpx.AsyncClient(transport=transport, base_url=BASE) as client:
        await client.get("/")  # every answer carries a session cookie; the client's jar keeps it
        seeding = asyncio.create_task(client.post("/seed_session", json=row(folder, "slow")))
        await asyncio.sleep(0.3)  # inside the slow seed's 1 s data/add
        closing = await client.post("/close_session", json={})
        seeded = await seeding
        assert closing.status_code == 200
        assert (seeded.status_code, seeded.json()["failure_kind"]) == (503, "cancelled")
        # The next episode gets the instance reset: the slow seed's data did not land on it.
        answer = await play(transport, row(folder, "count-to-3"))
        assert (answer["reward"], answer["mask_sample"]) == (1.0, False), answer
        after = await status(transport)
        assert after["open_episodes"] == 0
        assert after["counters"]["instances_replaced"] == 0  # a close is no fault of the instance's


async def test_repeated_seeds_on_one_session_while_the_pool_is_full(folder: Path) -> None:
    async with (
        served(folder, lease_timeout_s=5) as transport,
        httpx.AsyncClient(transport=transport, base_url=BASE) as client,
    ):
        holder = EpisodeClient(BASE, transport=transport)
        await holder.seed(row(folder, "count-to-3"))
        await client.get("/")
        seeds = [asyncio.create_task(client.post("/seed_session", json=row(folder, "count-to-3"))) for _ in range(3)]
        await asyncio.sleep(0.5)  # all three wait for the only instance
        await holder.call_tool("increment", {"by": 2})
        assert (await holder.verify(row(folder, "count-to-3")))["reward"] == 1.0
        answers = await asyncio.gather(*seeds)
        assert [answer.status_code for answer in answers] == [200, 200, 200]
        assert (await client.post("/increment", json={"by": 2})).status_code == 200
        response = EpisodeClient(BASE).transcript.response("")
        verdict = (await client.post("/verify", json={**row(folder, "count-to-3"), "response": response})).json()
        assert verdict["reward"] == 1.0
        pool = await settled_pool(BASE, transport)
        assert (pool["open_episodes"], pool["instances"][0]["state"]) == (0, "free")


async def test_a_verify_body_that_carries_answer_fields_is_answered(folder: Path) -> None:
    async with served(folder) as transport:
        the_row = {**row(folder, "count-to-3"), "reward": 0.5, "mask_sample": True, "criteria": ["stale"]}
        answer = await play(transport, the_row)
        assert (answer["reward"], answer["mask_sample"]) == (1.0, False)
        assert answer["criteria"][0]["score"] == 1.0


async def test_a_client_that_disconnects_mid_seed_leaves_no_stuck_instance(folder: Path) -> None:
    """On nemo-gym 0.5+ the handler is cancelled when its client goes; the seed still ends whole, the orphaned
    episode expires, and the instance serves the next episode."""
    command = gymhost_command("serve", str(folder), "--port", "0", "--set", "idle_timeout_s=1")
    with serving(command) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=0.3) as impatient:
            with pytest.raises(httpx.ReadTimeout):
                await impatient.post("/seed_session", json=row(folder, "slow"))
        # The orphaned episode expires, its instance is replaced by a fresh one: the pool settles, nothing stuck.
        pool = await settled_pool(server.url)
        assert pool["open_episodes"] == 0, pool
        async with EpisodeClient(server.url) as episode:
            await episode.seed(row(folder, "count-to-3"))
            await episode.call_tool("increment", {"by": 2})
            answer = await episode.verify(row(folder, "count-to-3"))
        assert (answer["reward"], answer["mask_sample"]) == (1.0, False)


def test_check_reports_a_task_whose_seed_the_environment_rejects(tmp_path: Path) -> None:
    bad = {**COUNTER_TASK, "id": "no-start", "seed": {"parts": [{"kind": "data", "data": {"begin": 1}}]}}
    written = write_folder(str(make_bundle(tmp_path, tasks=[COUNTER_TASK, bad])), tmp_path / "root").path
    result = run_to_completion(gymhost_command("check", str(written)))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "eval:no-start: reference masked: agentenv:data_plane_error: seed: " in result.stdout
    # The environment logs its own failure (with its traceback) on stderr; gymhost adds one line and no traceback.
    assert "HTTPStatusError" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == "Error: 1 of 2 rows failed the check"


async def test_a_tool_call_longer_than_the_idle_timeout_does_not_expire_its_episode(folder: Path) -> None:
    """Idle means no call, not a long one: the sweeper must not end an episode while its tool call runs."""
    async with served(folder, idle_timeout_s=0.5) as transport:
        the_row = row(folder, "count-to-3")
        async with EpisodeClient(BASE, transport=transport) as episode:
            await episode.seed(the_row)
            assert (await episode.call_tool("stall", {"seconds": 2})).ok
            assert (await episode.call_tool("increment", {"by": 2})).ok
            answer = await episode.verify(the_row)
        assert (answer["reward"], answer["mask_sample"]) == (1.0, False), answer
        assert (await status(transport))["counters"]["expired"] == 0
