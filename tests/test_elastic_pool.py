"""The elastic pool: instances started on demand up to a maximum, stopped when idle down to a minimum, a bounded
number started at a time, and dead ones replaced before a seed can take them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gymhost import EpisodeClient
from gymhost.environments import awrite_folder

from .agentenv_helpers import COUNTER_ENV, make_bundle, pool_status, rows, served
from .processes import STATE_TIMEOUT_S, alive, children, command_line, hosting, parent
from .verdicts import verdict

pytestmark = [pytest.mark.nemo_gym, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

BASE = "http://elastic.test"

# The counter environment, recording when each instance's constructor starts and ends (to the file its bundle's
# startup.json names), and taking a while to start: so overlapping start-ups can be counted. (A file, not variables:
# an instance's environment holds none of the server's.)
SLOW_START = COUNTER_ENV.replace(
    """    def __init__(self) -> None:
        self.count = 0
""",
    """    def __init__(self) -> None:
        import json, os, pathlib, time
        settings = json.loads(pathlib.Path(__file__).with_name("startup.json").read_text())
        began = time.monotonic()
        time.sleep(settings["sleep"])
        try:  # out of reach where the instance is confined (as when gymhost write inspects it): nothing to log
            with open(settings["log"], "a") as out:
                out.write(f"{os.getpid()} {began} {time.monotonic()}\\n")
        except OSError:
            pass
        self.count = 0
""",
).replace("{TOOL}", "increment")


async def write(tmp_path: Path, instances: str, mode: str = "process", slow: dict[str, Any] | None = None) -> Path:
    """The counter bundle written; ``slow`` (``{"log": PATH, "sleep": SECONDS}``) makes its start-ups slow and
    logged."""
    bundle = make_bundle(tmp_path / "bundles")
    if slow is not None:
        (bundle / "env.py").write_text(SLOW_START)
        (bundle / "startup.json").write_text(json.dumps(slow))
    return (await awrite_folder(str(bundle), tmp_path / "root", instances=instances, mode=mode)).path


async def hold(transport: httpx.AsyncBaseTransport, row: dict[str, Any]) -> tuple[EpisodeClient, int]:
    """A seeded episode that keeps its instance until verified; with the seed's status."""
    episode, response = await seed(transport, row)
    return episode, response.status_code


async def seed(transport: httpx.AsyncBaseTransport, row: dict[str, Any]) -> tuple[EpisodeClient, httpx.Response]:
    episode = EpisodeClient(BASE, transport=transport)
    response = await episode.post("/seed_session", row)
    episode.cookies.update(response.cookies)
    return episode, response


async def finish(episode: EpisodeClient, row: dict[str, Any]) -> dict[str, Any]:
    await episode.call_tool("increment", {"by": 2})
    return await episode.verify(row)


@pytest.mark.parametrize("mode", ["process", "in_process"])
async def test_the_pool_grows_to_its_maximum_then_answers_503_naming_the_option(tmp_path: Path, mode: str) -> None:
    folder = await write(tmp_path, "1:3", mode)
    row = rows(folder)[0]
    # Long enough for two instance processes to start on a busy machine; the refused seed waits it out too.
    async with served(folder, lease_timeout_s=5) as transport:
        limits = (await pool_status(BASE, transport))["limits"]
        assert (limits["min_instances"], limits["max_instances"]) == (1, 3)
        held = await asyncio.gather(*(hold(transport, row) for _ in range(3)))
        assert [status for _, status in held] == [200, 200, 200], "three seeds at once: two instances started"
        status = await pool_status(BASE, transport)
        assert (len(status["instances"]), status["leased"], status["counters"]["instances_started"]) == (3, 3, 3)
        _, refused = await seed(transport, row)
        assert refused.status_code == 503
        assert refused.json()["failure_kind"] == "provider_unavailable"
        assert "all 3 instances (the maximum, source.max_instances)" in refused.json()["detail"]
        for episode, _ in held:
            assert (await finish(episode, row))["reward"] == 1.0


async def test_instances_free_past_instance_idle_s_are_stopped_down_to_the_minimum(tmp_path: Path) -> None:
    folder = await write(tmp_path, "1:4")
    row = rows(folder)[0]
    # Instances kept for another episode (not fresh for each), so that four of them are left free after the four.
    async with served(folder, instance_idle_s=1.0, source={"fresh_instances": False}) as transport:
        held = await asyncio.gather(*(hold(transport, row) for _ in range(4)))
        status = await pool_status(BASE, transport)
        pids = [instance["pid"] for instance in status["instances"]]
        assert len(pids) == 4
        for episode, _ in held:
            assert (await finish(episode, row))["reward"] == 1.0
        deadline = time.monotonic() + STATE_TIMEOUT_S
        while len((await pool_status(BASE, transport))["instances"]) > 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        status = await pool_status(BASE, transport)
        assert len(status["instances"]) == 1, status
        assert status["counters"]["instances_stopped"] == 3
        kept = [status["instances"][0]["pid"]]
        template = parent(kept[0])  # instances are forked from the pool's template process
        mine = children(os.getpid())
        assert mine == hosting(os.getpid(), template)[:1], [command_line(pid) for pid in mine]
        deadline = time.monotonic() + STATE_TIMEOUT_S  # stopped gracefully, then reaped
        while children(template) != kept and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert children(template) == kept, "the stopped instances' processes are gone, and reaped"
        assert not any(alive(pid) for pid in pids if pid not in kept)
        # The one left plays; the pool grows again when asked.
        again = await asyncio.gather(*(hold(transport, row) for _ in range(2)))
        assert [code for _, code in again] == [200, 200]
        for episode, _ in again:
            assert (await finish(episode, row))["reward"] == 1.0


async def test_start_ups_run_in_parallel_a_bounded_number_at_a_time(tmp_path: Path) -> None:
    log = tmp_path / "startups.log"
    folder = await write(tmp_path, "1:7", slow={"log": str(log), "sleep": 0.6})
    row = rows(folder)[0]
    # Each instance runs the slow constructor after its fork (by default the template would construct once), and
    # writes to the test's log: unconfined, as a confined one could not (tests/test_confinement.py).
    source = {"construct_once": False, "sandbox": "off"}
    async with served(folder, parallel_startups=2, source=source) as transport:
        log.write_text("")  # only the start-ups the seeds cause
        held = await asyncio.gather(*(hold(transport, row) for _ in range(7)))
        assert [code for _, code in held] == [200] * 7
        for episode, _ in held:
            assert (await finish(episode, row))["reward"] == 1.0
    spans = [tuple(map(float, line.split()[1:])) for line in log.read_text().splitlines()]
    assert len(spans) == 6, spans
    overlaps = [sum(begin <= moment < end for begin, end in spans) for moment, _ in spans]
    assert max(overlaps) == 2, f"start-ups overlapped {max(overlaps)} at a time, not parallel_startups=2: {spans}"


async def test_instances_killed_while_free_are_replaced_before_any_seed_takes_them(tmp_path: Path) -> None:
    folder = await write(tmp_path, "4:8")
    row = rows(folder)[0]
    async with served(folder) as transport:
        status = await pool_status(BASE, transport)
        pids = [instance["pid"] for instance in status["instances"]]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        held = await asyncio.gather(*(hold(transport, row) for _ in range(8)))
        assert [code for _, code in held] == [200] * 8, "no seed took a dead instance"
        answers = await asyncio.gather(*(finish(episode, row) for episode, _ in held))
        assert [(a["reward"], a["mask_sample"]) for a in answers] == [(1.0, False)] * 8
        status = await pool_status(BASE, transport)
        assert status["counters"]["instances_replaced"] == 4
        assert not set(pids) & {instance["pid"] for instance in status["instances"]}


async def test_half_the_instances_killed_in_a_burst_cost_only_their_own_episodes(tmp_path: Path) -> None:
    folder = await write(tmp_path, "4:8")
    row = rows(folder)[0]
    async with served(folder) as transport:

        async def episode_with_think_time() -> dict[str, Any]:
            async with EpisodeClient(BASE, transport=transport) as episode:
                seeded = await episode.post("/seed_session", row)
                if seeded.status_code != 200:
                    return {"seed": seeded.status_code, **seeded.json()}
                episode.cookies.update(seeded.cookies)
                holding.append(episode)
                try:
                    await asyncio.sleep(0.5)
                    await episode.call_tool("increment", {"by": 1})
                    await asyncio.sleep(0.5)
                    await episode.call_tool("increment", {"by": 1})
                    return await verdict(episode, row)
                finally:
                    holding.remove(episode)

        holding: list[EpisodeClient] = []  # episodes seeded and not yet verified: each holds a leased instance
        burst = [asyncio.create_task(episode_with_think_time()) for _ in range(24)]
        while True:  # until every leased instance holds a seeded episode (none is between a lease and its seed)
            await asyncio.sleep(0.01)
            status = await pool_status(BASE, transport)
            leased = [instance["pid"] for instance in status["instances"] if instance["state"] == "leased"]
            if leased and len(leased) == len(holding):
                break
        victims = leased[::2]
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        answers = await asyncio.gather(*burst)
        played = [a for a in answers if "seed" not in a and not a["mask_sample"]]
        masked = [a for a in answers if "seed" not in a and a["mask_sample"]]
        refused = [a for a in answers if "seed" in a]
        assert not refused, refused  # nothing failed to seed
        assert all(a["reward"] == 1.0 for a in played), played
        assert all(a["failure_kind"] in {"transport_unreachable", "transport_peer_drop"} for a in masked), masked
        assert 0 < len(masked) <= len(victims), json.dumps(answers)[:2000]
        assert len(played) + len(masked) == 24
