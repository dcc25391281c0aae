"""`gymhost serve --workers N`: every request of an episode reaches the worker that holds it, in every flow; a
worker that dies is replaced and its episodes end as lost, never as a genuine-looking score; metrics add up across
workers; SIGTERM drains them all."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gymhost import EpisodeClient
from gymhost._sessions._owner import unchecked_cookie_owner
from gymhost.environments import Task, load_tasks, write_folder

from .agentenv_helpers import GRIDSIM, rows
from .gym_plays import example_rows, play_mcp_weather, play_session_state
from .processes import CALL_TIMEOUT_S, STATE_TIMEOUT_S, ServerProcess, children, gymhost_command, serving

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

TASKS: dict[str, Task] = {task.id: task for task in load_tasks(GRIDSIM / "tasks" / "eval.jsonl")}
WORKERS = 2


@pytest.fixture(scope="module")
def gridsim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_folder(str(GRIDSIM), tmp_path_factory.mktemp("workers"), mode="in-process", instances="4:64").path


@contextmanager
def serve(folder: Path, *args: str) -> Iterator[ServerProcess]:
    with serving(gymhost_command("serve", str(folder), "--port", "0", "--workers", str(WORKERS), *args)) as server:
        # Every worker serving, not only forked: one still starting on a loaded machine holds nothing and says nothing.
        deadline = time.monotonic() + STATE_TIMEOUT_S
        while (
            len(children(server.process.pid)) < WORKERS
            or server.output.count("Application startup complete.") < WORKERS
        ) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(children(server.process.pid)) == WORKERS, server.output
        assert server.output.count("Application startup complete.") == WORKERS, server.output
        yield server


def forwarded(url: str) -> float:
    return counted(url, "http_server_request_duration_seconds_count", http_route="(forwarded)")


def handed_off(url: str) -> float:
    return counted(url, "gymhost_handoffs_total", outcome="sent")


def counted(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(key) == value for key, value in labels.items())
    )


def worker_of(episode: EpisodeClient) -> int:
    """The worker holding an episode, as its session cookie names it."""
    (value,) = episode.cookies.values()
    owner = unchecked_cookie_owner(value.encode())
    assert isinstance(owner, dict), value
    return int(owner["worker"])


async def play_gridsim(url: str, row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """verifiers' way: a new connection for every request, the seed's cookies replayed."""
    solution = TASKS[row["task_id"]].solution
    assert solution is not None
    async with EpisodeClient(url) as episode:
        await episode.seed(row)
        for call in solution.tool_calls:
            output = await episode.call_tool(f"{prefix}{call.name}", call.arguments)
            assert output.ok, output.text
        return await episode.verify(row, solution.final_text)


@pytest.mark.parametrize("routing", ["--hand-off", "--no-hand-off"])
async def test_cookie_flow_episodes_reach_their_worker(gridsim: Path, gym_root: Path, routing: str) -> None:
    """A new connection per call, as verifiers makes them: about half land on the worker that does not hold their
    episode, and every episode reaches its owner (each scores 1.0). Handed off, the connection itself goes to its
    owner; the few that cannot be (a head that came in pieces on a busy machine) are forwarded instead, and counted.
    Without hand-off, the accepting worker forwards the request."""
    with serve(gridsim, routing) as server:
        answers = await asyncio.gather(*(play_gridsim(server.url, row) for row in rows(gridsim) * 2))
        assert [answer["reward"] for answer in answers] == [1.0] * 20
        if routing == "--hand-off":
            sent, fell_back = handed_off(server.url), forwarded(server.url)
            assert sent > 0, "some connections were accepted by a worker not holding their episode"
            assert fell_back < sent, f"hand-off is the way: {sent} handed off, {fell_back} forwarded instead"
        else:
            assert forwarded(server.url) > 0, "some requests were accepted by a worker that did not hold their episode"
            assert handed_off(server.url) == 0
    folder = gym_root / "example_session_state_mgmt"
    row = example_rows(folder)[0]
    with serve(folder, routing) as server:
        answers = await asyncio.gather(*(play_session_state(server.url, row, True) for _ in range(10)))
        assert [answer["reward"] for answer in answers] == [1.0] * 10


async def post_in_pieces(url: str, path: str, body: dict[str, Any], cookies: httpx.Cookies) -> int:
    """A POST whose head comes in two segments, as a slow client's does: the worker accepting it cannot read its
    owner at once, so it serves it, and forwards it when another worker owns its session."""
    host, _, port = url.removeprefix("http://").partition(":")
    data = json.dumps(body).encode()
    cookie = "; ".join(f"{name}={value}" for name, value in cookies.items())
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\ncookie: {cookie}\r\nconnection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head[:24])
    await writer.drain()
    await asyncio.sleep(0.5)  # long enough for a worker on a busy machine to take it and read the first piece
    writer.write(head[24:] + data)
    answer = await asyncio.wait_for(reader.read(), CALL_TIMEOUT_S)
    writer.close()
    return int(answer.split(b" ", 2)[1])


async def test_a_head_in_pieces_still_reaches_its_worker(gridsim: Path) -> None:
    """What a hand-off cannot serve goes by the forward, as before it."""
    row = next(r for r in rows(gridsim) if r["task_id"] == "reach-corner")
    solution = TASKS["reach-corner"].solution
    assert solution is not None

    async def play() -> dict[str, Any]:
        async with EpisodeClient(server.url) as episode:
            await episode.seed(row)
            for call in solution.tool_calls:
                assert await post_in_pieces(server.url, f"/{call.name}", call.arguments, episode.cookies) == 200
            return await episode.verify(row)

    with serve(gridsim) as server:
        answers = await asyncio.gather(*(play() for _ in range(8)))
        assert [answer["reward"] for answer in answers] == [1.0] * 8
        assert forwarded(server.url) > 0, "about half of the 16 calls in pieces landed on the other worker"


async def test_rollout_paths_and_the_resources_session_flow_reach_their_worker(
    gridsim: Path, gym_version: tuple[int, ...]
) -> None:
    row = next(r for r in rows(gridsim) if r["task_id"] == "reach-corner")
    with serve(gridsim) as server:
        if gym_version < (0, 5):  # nemo-gym 0.4.0 has neither: a caller-named seed is a row without a task
            answer = httpx.post(
                f"{server.url}/seed_session", json={"resources_session_id": "x"}, timeout=CALL_TIMEOUT_S
            )
            assert answer.status_code == 422
            return
        through_rollout_paths = await asyncio.gather(
            *(play_gridsim(server.url, row, prefix=f"ng-rollout/r{n}/") for n in range(12))
        )
        assert [answer["reward"] for answer in through_rollout_paths] == [1.0] * 12

        async def caller_named(n: int) -> dict[str, Any]:
            seed = {
                "resources_session_id": f"rs-{n}",
                "episode_id": {"rollout_id": f"r{n}"},
                "task_id": {"taskset": "gridsim", "task_id": "reach-corner"},
                "task_data": {"task_id": "reach-corner", "split": "eval"},
            }
            async with EpisodeClient(server.url) as episode:
                for _ in range(2):  # a repeated seed goes to the owner, which answers it as the same episode
                    answer = await episode.post("/seed_session", seed)
                    assert answer.status_code == 200, answer.text
                    episode.cookies.update(answer.cookies)
                for call in TASKS["reach-corner"].solution.tool_calls:  # type: ignore[union-attr]
                    assert (await episode.call_tool(call.name, call.arguments)).ok
                verdict = await episode.verify(row)
                close = await episode.post("/close_session", {"resources_session_id": f"rs-{n}", **seed})
                assert close.status_code == 200, close.text
                return verdict

        answers = await asyncio.gather(*(caller_named(n) for n in range(12)))
        assert [answer["reward"] for answer in answers] == [1.0] * 12
        deadline = time.monotonic() + 30  # until each worker has refreshed its gauge (every second)
        while counted(server.url, "gymhost_episodes_open") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert counted(server.url, "gymhost_episodes_open") == 0, "every episode ended on its worker"


async def test_mcp_token_calls_reach_their_worker(gym_root: Path) -> None:
    folder = gym_root / "example_mcp_weather"
    row = example_rows(folder)[0]
    with serve(folder) as server:
        answers = await asyncio.gather(*(play_mcp_weather(server.url, row, True) for _ in range(8)))
        assert [answer["reward"] for answer in answers] == [1.0] * 8
        # an MCP session's connection (kept alive, its token on every request) goes to its owner at its first request
        assert handed_off(server.url) > 0


async def test_a_dead_worker_is_replaced_and_its_episodes_end_lost(gridsim: Path) -> None:
    row = next(r for r in rows(gridsim) if r["task_id"] == "reach-corner")
    with serve(gridsim) as server:
        # Twelve episodes or more, until each worker holds some: the kernel may give a run of connections to one.
        episodes: list[EpisodeClient] = []
        while len(episodes) < 12 or len({worker_of(episode) for episode in episodes}) < WORKERS:
            assert len(episodes) < 200, "the kernel gave 200 connections in a row to one worker"
            episodes.append(EpisodeClient(server.url))
            await episodes[-1].seed(row)
        victim = children(server.process.pid)[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + STATE_TIMEOUT_S
        while (victim in children(server.process.pid) or len(children(server.process.pid)) < WORKERS) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert victim not in children(server.process.pid)
        assert len(children(server.process.pid)) == WORKERS, "the dead worker was replaced"
        verdicts = []
        for episode in episodes:
            move = await episode.call_tool("gridsim_move", {"direction": "right"})
            if move.status_code == 410:
                answer = await episode.post("/verify", {**row, "response": episode.transcript.response("")})
                verdicts.append(("lost", answer.status_code, answer.json()))
            else:
                await episode.call_tool("gridsim_move", {"direction": "up"})
                verdicts.append(("played", 200, await episode.verify(row)))
        lost = [answer for kind, _, answer in verdicts if kind == "lost"]
        played = [answer for kind, _, answer in verdicts if kind == "played"]
        assert lost, "the killed worker held some of the episodes"
        assert played, "the other worker's episodes went on"
        assert all(answer["reward"] == 1.0 for answer in played)
        for kind, status, answer in verdicts:
            if kind == "lost":
                assert (status, answer["failure_kind"], answer["verdict"]["mask_sample"]) == (410, "session_lost", True)
        assert (await play_gridsim(server.url, row))["reward"] == 1.0, "new episodes play on the new worker"


@pytest.mark.parametrize("count", [*(pytest.param(1, id=f"one-episode-{n}") for n in range(2)), 8])
async def test_sigterm_drains_every_worker(gridsim: Path, count: int) -> None:
    """SIGTERM the moment the last seed answers: every worker drains until every episode has ended, the worker
    holding none of them included (it may be accepting their requests), and every episode plays to its verdict. One
    episode leaves a worker holding none for certain, the case a drain reading its siblings' counts from an older
    moment stops at once in; eight spread over both."""
    row = next(r for r in rows(gridsim) if r["task_id"] == "reach-corner")
    with serve(gridsim, "--drain-timeout", "60") as server:
        episodes = [EpisodeClient(server.url) for _ in range(count)]
        for episode in episodes:
            await episode.seed(row)
        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STATE_TIMEOUT_S  # every worker has begun its drain (each says so), or one stopped
        while (
            server.output.count("draining: no new episodes") < WORKERS
            and "stopping: no episode is open" not in server.output
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert server.output.count("draining: no new episodes") == WORKERS, server.output
        refused = httpx.post(f"{server.url}/seed_session", json=row, timeout=CALL_TIMEOUT_S)
        assert (refused.status_code, refused.json()["failure_kind"]) == (503, "provider_unavailable")
        for episode in episodes:  # open episodes, on either worker, play to their end
            for call in TASKS["reach-corner"].solution.tool_calls:  # type: ignore[union-attr]
                assert (await episode.call_tool(call.name, call.arguments)).ok
            assert (await episode.verify(row))["reward"] == 1.0
        server.process.wait(20)
    assert server.output.count("drained: every open episode has ended") == WORKERS, server.output
    assert "stopping: no episode is open" not in server.output
    assert json.dumps(server.output).count("Traceback") == 0
