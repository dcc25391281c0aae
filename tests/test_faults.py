"""Faults, on a real `gymhost serve` process whose instances are real processes (process mode), on 127.0.0.1.

What the issue promises: an instance that crashes, is killed, hangs or answers garbage costs the one episode it was
playing (masked, with a failure_kind from nemo-gym's vocabulary or a namespaced one of gymhost's), is replaced by a
new process, and the pool serves the next episode; every call to an instance has a time limit; and no instance
process outlives the server, even one killed with SIGKILL in the middle of a call.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gymhost import EpisodeClient

from .agentenv_helpers import pool_status_of
from .fault_helpers import await_for, awrite_faulty, is_failure_kind, play_right, the_row, wait_for, write_faulty
from .processes import (
    STATE_TIMEOUT_S,
    ServerProcess,
    alive,
    assert_stopped_cleanly,
    children,
    descendants,
    environment_process,
    gymhost_command,
    hosting,
    instance_processes,
    parent,
    reaped,
    serving,
)
from .verdicts import verdict

pytestmark = [pytest.mark.nemo_gym, pytest.mark.processes, pytest.mark.anyio, pytest.mark.usefixtures("clean_env")]

TIME_LIMIT_S = 1  # tool_timeout_s and data_timeout_s of the shared server: a hang costs about a second


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The faulty bundle written with one instance: every next episode has to be played on the replacement."""
    return write_faulty(tmp_path_factory.mktemp("faulty"), instances=1)


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[ServerProcess]:
    """One server for the fault tests, one fault after another on its one-instance pool: the pool must come back
    after each, so a fault that leaves it broken fails the next test too (each test says so if the pool is not
    back when it starts)."""
    limits = ["--set", f"tool_timeout_s={TIME_LIMIT_S}", "--set", f"data_timeout_s={TIME_LIMIT_S}"]
    with serving(gymhost_command("serve", str(folder), "--port", "0", *limits)) as running:
        yield running
    assert_stopped_cleanly(running)


@pytest.fixture
def row(folder: Path) -> dict[str, Any]:
    return the_row(folder)


def the_free_instance(server: ServerProcess) -> dict[str, Any]:
    """The pool's one instance, once it is free (a replacement takes about a second to start)."""

    def free() -> dict[str, Any] | None:
        status = pool_status_of(server.url)
        return status["instances"][0] if status["free"] == 1 else None

    instance: dict[str, Any] = wait_for("the pool's one instance is free", free)
    return instance


async def kill_the_instance(episode: EpisodeClient, pid: int) -> None:
    """kill -9 of the leased instance between two calls; the next call finds nobody listening."""
    os.kill(pid, signal.SIGKILL)
    wait_for(f"instance {pid} is dead", lambda: not alive(pid), timeout=5)
    await refused(episode.call_tool("add", {"n": 2}))


async def crash(episode: EpisodeClient, pid: int) -> None:
    """The instance's process exits in the middle of a tool call."""
    await refused(episode.call_tool("crash"))


async def hang(episode: EpisodeClient, pid: int) -> None:
    """A tool call that never answers is cut off after tool_timeout_s."""
    started = time.monotonic()
    await refused(episode.call_tool("hang"), f"did not answer within {TIME_LIMIT_S}s")
    assert time.monotonic() - started < TIME_LIMIT_S + 5


async def garbage_on_the_channel(episode: EpisodeClient, pid: int) -> None:
    """The instance process writes bytes that are not a frame onto its channel in the middle of a call."""
    await refused(episode.call_tool("garbage", {"where": "channel"}))


async def garbage_on_the_data_plane(episode: EpisodeClient, pid: int) -> None:
    """The next data-plane reply (verify's data/get) is JSON-RPC without a result: the grading cannot read it."""
    assert (await episode.call_tool("garbage", {"where": "agentenv"})).ok
    assert (await episode.call_tool("add", {"n": 2})).ok  # the right play: only the broken reply can mask it


async def data_plane_hang(episode: EpisodeClient, pid: int) -> None:
    """The next data-plane reply (verify's data/get) never comes: data_timeout_s is the limit."""
    assert (await episode.call_tool("hang_next", {"where": "agentenv"})).ok
    assert (await episode.call_tool("add", {"n": 2})).ok


async def refused(call: Awaitable[Any], says: str = "") -> None:
    output = await call
    assert output.status_code == 503, output
    detail = json.loads(output.text)["detail"]
    assert detail.startswith("the environment is unavailable: tool "), detail
    assert says in detail


FAULTS: dict[str, tuple[Callable[[EpisodeClient, int], Awaitable[None]], str]] = {
    "kill -9": (kill_the_instance, "transport_unreachable"),
    "crash": (crash, "transport_peer_drop"),
    "hang": (hang, "transport_timeout"),
    "garbage on the channel": (garbage_on_the_channel, "agentenv:malformed_reply"),
    "garbage on the data plane": (garbage_on_the_data_plane, "agentenv:malformed_reply"),
    "data-plane hang": (data_plane_hang, "transport_timeout"),
}


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_broken_instance_costs_one_masked_episode_then_is_replaced(
    server: ServerProcess, row: dict[str, Any], fault: str
) -> None:
    """The episode that met the fault is masked (reward 0, a failure_kind naming what happened); its instance's
    process is gone and a new one serves; the next episode on the pool scores 1.0; the server has exactly one
    child process (nothing leaked, nothing left unreaped) and its counters say one masked episode, one
    replacement."""
    inject, expected_kind = FAULTS[fault]
    before = the_free_instance(server)
    counters = pool_status_of(server.url)["counters"]
    async with EpisodeClient(server.url) as episode:
        await episode.seed(row)
        assert (await episode.call_tool("add", {"n": 1})).ok  # the instance works until the fault
        await inject(episode, before["pid"])
        answer = await verdict(episode, row)
    assert (answer["reward"], answer["mask_sample"]) == (0.0, True), answer
    assert is_failure_kind(answer["failure_kind"]), answer
    assert answer["failure_reason"]

    after = the_free_instance(server)
    assert after["pid"] != before["pid"], "the broken instance was put back instead of replaced"
    # Reaped, not only dead: a confined instance is the first process of its PID namespace, and stays a zombie
    # for a moment after its exit while the kernel ends its namespace; counted below, it would be a leak.
    wait_for(f"the broken instance {before['pid']} is reaped", lambda: reaped(before["pid"]), timeout=10)
    template = parent(after["pid"])  # instances are forked from the pool's template process
    expected = [*hosting(server.process.pid, template), *instance_processes(after["pid"])]
    assert descendants(server.process.pid) == sorted(expected)
    replayed = await play_right(server.url, row)
    assert (replayed["reward"], replayed["mask_sample"]) == (1.0, False), replayed
    now = pool_status_of(server.url)["counters"]
    assert now["masked"] - counters["masked"] == 1
    assert now["instances_replaced"] - counters["instances_replaced"] == 1
    assert answer["failure_kind"] == expected_kind, answer["failure_reason"]


def test_the_time_limits_are_the_ones_configured(server: ServerProcess) -> None:
    """The limits the hang tests rely on are the server's own, as `--set` gave them, and shown on the pool."""
    limits = pool_status_of(server.url)["limits"]
    assert (limits["tool_timeout_s"], limits["data_timeout_s"]) == (TIME_LIMIT_S, TIME_LIMIT_S)
    assert (limits["min_instances"], limits["max_instances"]) == (1, 1)


async def test_an_instance_killed_while_free_costs_no_episode(server: ServerProcess, row: dict[str, Any]) -> None:
    """An instance can die between episodes, with nobody calling it. The pool only learns at the next seed, when
    the reset finds nobody listening: that seed waits for the replacement instead of failing."""
    before = the_free_instance(server)
    os.kill(before["pid"], signal.SIGKILL)
    wait_for(f"instance {before['pid']} is dead", lambda: not alive(before["pid"]), timeout=5)
    answer = await play_right(server.url, row)
    assert (answer["reward"], answer["mask_sample"]) == (1.0, False), answer
    assert the_free_instance(server)["pid"] != before["pid"]


def test_instance_processes_do_not_preempt_the_server_on_wakeup(server: ServerProcess) -> None:
    """Instances are batch processes to the scheduler (the server's writes wake them without taking its core); the
    server itself is an ordinary one."""
    assert os.sched_getscheduler(environment_process(the_free_instance(server)["pid"])) == os.SCHED_BATCH
    assert os.sched_getscheduler(server.process.pid) == os.SCHED_OTHER


async def test_no_instance_outlives_a_server_killed_mid_call(tmp_path: Path, row: dict[str, Any]) -> None:
    """SIGKILL of the server while one episode is inside a tool call that hangs, and another instance's replacement
    is starting: the server gets no chance to stop anything, so every process it started (as of the moment of the
    kill, the one being started included) must go by itself, through its death pipe, within a few seconds. The
    client inside the hanging call gets an error, not a wait forever. (test_agentenv_server covers SIGKILL of an
    idle server.)"""
    three = ["--set", "source.instances=3", "--set", "source.max_instances=3"]
    each = ["--set", "source.construct_once=false"]  # each instance runs the slow constructor after its fork
    # Instances take 2 s to start (after the fork, in the environment's constructor): the replacement is still
    # starting when the server is killed.
    folder = await awrite_faulty(tmp_path, instances=1, start_delay=2)
    command = gymhost_command("serve", str(folder), "--port", "0", *three, *each)
    with serving(command) as server:
        instances = {instance["pid"] for instance in pool_status_of(server.url)["instances"]}
        template = parent(next(iter(instances)))  # read while every instance is alive: one is about to crash
        async with EpisodeClient(server.url) as stuck, EpisodeClient(server.url) as crashed:
            await asyncio.gather(stuck.seed(row), crashed.seed(row))
            hanging = asyncio.create_task(stuck.call_tool("hang"))
            await await_for("a tool call is hanging in an instance", lambda: any_instance_hanging(server.url))
            await refused(crashed.call_tool("crash"))
            assert (await verdict(crashed, row))["mask_sample"] is True  # its instance goes to be replaced

            def replacement_starting() -> list[int]:
                alive_instances = [pid for pid in children(template) if alive(pid)]
                return alive_instances if set(alive_instances) - instances else []

            started = await await_for("the replacement's process is started", replacement_starting, interval=0.01)
            assert pool_status_of(server.url)["starting"] == 1, (
                "the replacement was up before the kill: too slow a test"
            )
            assert len(started) == 3, started  # the hanging instance, the idle one, the replacement
            started = [*hosting(server.process.pid, template), *descendants(template)]  # and what runs under them
            server.process.send_signal(signal.SIGKILL)
            server.process.wait(STATE_TIMEOUT_S)
            with pytest.raises(httpx.TransportError):
                await asyncio.wait_for(hanging, STATE_TIMEOUT_S)
    wait_for(
        f"every instance {started} dies with the server",
        lambda: not any(alive(pid) for pid in started),
        STATE_TIMEOUT_S,
    )


def any_instance_hanging(base: str) -> bool:
    """Whether an instance's data/get (read through the server) says one of its tool calls is hanging."""
    for instance in pool_status_of(base)["instances"]:
        data = httpx.get(f"{base}/agentenv/pool/{instance['index']}", timeout=10).json()["data"]
        if data and data.get("hanging"):
            return True
    return False
