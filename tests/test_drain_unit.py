"""A worker's drain waits for its siblings' episodes by the counts they say during their own drain, never by an
older count: one holding none of the replica's episodes waits while a sibling has said nothing yet, and while a
sibling holds some; a sibling gone counts none; a worker signalled alone waits for its own episodes only.

The process-level proof is ``tests/test_workers.py::test_sigterm_drains_every_worker``; here worker 1 is the test,
saying its counts through the same folder, step by step."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from starlette.types import Message, Receive, Scope, Send

from gymhost import _drain
from gymhost._drain import Drain, DrainingMiddleware, WorkerCounts
from gymhost._sessions._identity import process_state

from .processes import STATE_TIMEOUT_S

pytestmark = [pytest.mark.unit, pytest.mark.anyio]


@pytest.fixture
def counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> WorkerCounts:
    """Worker 0 of two, as the supervisor started them."""
    monkeypatch.setattr(process_state, "worker", 0)
    monkeypatch.setattr(process_state, "workers_dir", str(tmp_path))
    monkeypatch.setattr(process_state, "parent", None)
    counts = WorkerCounts(tmp_path)
    counts.started(0)
    counts.started(1)
    return counts


def holding(episodes: int) -> Drain:
    drain = Drain()
    drain.count_open(1, lambda: episodes)
    return drain


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(30):
        while not condition():
            await asyncio.sleep(0.01)


def said(folder: Path, index: int) -> tuple[str, int]:
    """What worker ``index`` said last, and which saying it was (each is a new file)."""
    path = folder / f"worker-{index}.open"
    return path.read_text(), path.stat().st_ino


async def polled_after(folder: Path) -> None:
    """Worker 0 has looked again since now: it says its own count at every look."""
    before = said(folder, 0)
    await until(lambda: said(folder, 0)[1] != before[1])


async def test_a_worker_holding_none_waits_for_a_sibling_that_has_not_said_and_one_that_holds_some(
    counts: WorkerCounts, caplog: pytest.LogCaptureFixture
) -> None:
    counts.mark_draining()
    caplog.set_level(logging.INFO, "gymhost")
    waiting = asyncio.create_task(holding(0).wait(60))
    await until(lambda: said(counts.folder, 0)[0] == "0")  # its own count, said at once
    await polled_after(counts.folder)
    assert not waiting.done(), "worker 1 has said nothing yet"
    counts.say(1, 2)
    await polled_after(counts.folder)
    await polled_after(counts.folder)
    assert not waiting.done(), "worker 1 holds two episodes"
    counts.say(1, 0)
    await asyncio.wait_for(waiting, STATE_TIMEOUT_S)
    assert "drained: every open episode has ended" in caplog.text
    assert "stopping: no episode is open" not in caplog.text


async def test_a_sibling_gone_holds_nothing(counts: WorkerCounts) -> None:
    counts.mark_draining()
    counts.say(1, 3)
    waiting = asyncio.create_task(holding(0).wait(60))
    await until(lambda: said(counts.folder, 0)[0] == "0")
    await polled_after(counts.folder)
    assert not waiting.done()
    counts.gone(1)  # killed with its three episodes: the supervisor says so
    await asyncio.wait_for(waiting, STATE_TIMEOUT_S)


async def test_siblings_that_said_none_let_a_worker_holding_none_stop_at_once(
    counts: WorkerCounts, caplog: pytest.LogCaptureFixture
) -> None:
    counts.mark_draining()
    counts.say(1, 0)
    caplog.set_level(logging.INFO, "gymhost")
    await asyncio.wait_for(holding(0).wait(60), STATE_TIMEOUT_S)
    assert "stopping: no episode is open" in caplog.text


async def test_a_worker_signalled_alone_waits_for_its_own_episodes_only(
    counts: WorkerCounts, caplog: pytest.LogCaptureFixture
) -> None:
    """No mark: the replica is not draining (an operator stopped this worker, which the supervisor restarts)."""
    counts.say(1, 5)
    caplog.set_level(logging.INFO, "gymhost")
    await asyncio.wait_for(holding(0).wait(60), STATE_TIMEOUT_S)
    assert "stopping: no episode is open" in caplog.text


async def test_a_sibling_that_never_says_is_waited_for_until_the_timeout(
    counts: WorkerCounts, caplog: pytest.LogCaptureFixture
) -> None:
    counts.mark_draining()
    await asyncio.wait_for(holding(0).wait(0.5), STATE_TIMEOUT_S)
    assert "drain timeout: a worker never said how many episodes it holds" in caplog.text


async def test_a_seed_being_answered_when_the_drain_begins_is_waited_for(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A seed that passed the door before the drain began (an instance starting for it) is an episode about to be
    open: the drain waits for it instead of stopping and losing the episode the seed then answers."""
    process = Drain()
    monkeypatch.setattr(_drain, "drain", process)
    monkeypatch.setattr(process_state, "workers_dir", None)
    monkeypatch.setattr(process_state, "parent", None)
    caplog.set_level(logging.INFO, "gymhost")
    answering, answer = asyncio.Event(), asyncio.Event()
    sent: list[Message] = []

    async def seed_route(scope: Scope, receive: Receive, send: Send) -> None:
        answering.set()
        await answer.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive() -> Message:
        return {"type": "http.request", "body": b"{}"}

    async def send(message: Message) -> None:
        sent.append(message)

    door = DrainingMiddleware(seed_route, starts={"/seed_session"})
    scope = {"type": "http", "method": "POST", "path": "/seed_session", "root_path": "", "headers": []}
    seed = asyncio.create_task(door(scope, receive, send))
    await answering.wait()
    draining = asyncio.create_task(process.wait(60))
    await until(lambda: "waiting up to 60s for 1 open episode(s)" in caplog.text)
    assert not draining.done()
    answer.set()
    await asyncio.wait_for(asyncio.gather(seed, draining), STATE_TIMEOUT_S)
    assert sent[0]["status"] == 200
    assert "drained: every open episode has ended" in caplog.text
    assert "stopping: no episode is open" not in caplog.text
