"""The episode state machine on its own: a fake pool of in-memory instances, no nemo-gym, no HTTP.

Races are driven directly here (a seed held inside its ``data/add``, a tool call held inside the tool), so each
test says which interleaving it is about instead of hoping a timing produces it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from agentenv_protocol import ToolResult

from gymhost.environments import Task
from gymhost.environments._agentenv._backends import BUNDLE
from gymhost.environments._backend import Catalog
from gymhost.environments._episodes import Episodes
from gymhost.environments._errors import EnvDroppedError, EpisodeStateError, PoolExhaustedError, SessionConflictError
from gymhost.environments._grading import Asked, Observation
from gymhost.environments._outcomes import Failure, breaks_instance
from gymhost.environments._settings import EpisodeSettings
from gymhost.environments._tasks import Seed

from .agentenv_helpers import COUNTER_TASK

pytestmark = [pytest.mark.unit, pytest.mark.anyio]

CATALOG = Catalog("counter", ({"name": "increment"},))
TASK = Task.model_validate(COUNTER_TASK)  # seeded at 1; graded 1.0 at 3


class Gate:
    """A point a fake instance stops at until the test opens it; ``reached`` says it is there."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.opened = asyncio.Event()

    async def pass_through(self) -> None:
        self.reached.set()
        await self.opened.wait()


class FakeTools:
    def __init__(self, client: FakeClient) -> None:
        self.client = client
        self.closed = False

    async def open(self) -> FakeTools:
        return self

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if self.client.tool_gate is not None:
            await self.client.tool_gate.pass_through()
        if self.client.tool_error is not None:
            raise self.client.tool_error
        self.client.count += arguments.get("by", 1)
        return ToolResult(content=[{"type": "text", "text": json.dumps({"count": self.client.count})}])

    async def close(self) -> None:
        self.closed = True


class FakeClient:
    def __init__(self) -> None:
        self.count = 0
        self.add_gate: Gate | None = None
        self.add_error: Exception | None = None
        self.tool_gate: Gate | None = None
        self.tool_error: Exception | None = None

    async def begin(self, seed: Seed) -> None:
        if self.add_gate is not None:
            await self.add_gate.pass_through()
        if self.add_error is not None:
            raise self.add_error
        self.count = seed.parts[0].data["start"]  # type: ignore[union-attr]

    async def observe(self, catalog: Catalog, asked: Asked, final_text: str) -> Observation:
        return Observation(state={"count": self.count})

    def tool_session(self, catalog: Catalog, *, role: str | None, timeout: float) -> FakeTools:
        return FakeTools(self)


class FakeInstance:
    def __init__(self, index: int) -> None:
        self.index = index
        self.client = FakeClient()


class FakePool:
    """Instances in a list; a lease takes the first free one or fails at once; every release is recorded."""

    def __init__(self, size: int = 1) -> None:
        self.catalog = CATALOG
        self.instances = [FakeInstance(index) for index in range(size)]
        self.free = list(self.instances)
        self.releases: list[tuple[int, str | None]] = []
        self.stopped = False

    async def start(self) -> None:
        pass

    def begin_stop(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True

    def lease_deadline(self) -> float:
        return asyncio.get_running_loop().time() + 30.0

    async def lease(self, deadline: float | None = None) -> FakeInstance:
        if not self.free:
            raise PoolExhaustedError("no instance free")
        return self.free.pop(0)

    async def release(self, instance: FakeInstance, failure: Failure | None) -> None:
        self.releases.append((instance.index, failure.kind if failure else None))
        if not breaks_instance(failure):
            instance.client.count = 0  # the reset a real pool does
            self.free.append(instance)

    def status(self) -> dict[str, Any]:
        limits = {"min_instances": len(self.instances), "max_instances": len(self.instances)}
        return {"limits": limits, "instances": [], "free": len(self.free), "counters": {"lease_timeouts": 0}}

    async def instance_status(self, index: int) -> dict[str, Any] | None:
        return None


async def runtime(pool: FakePool, **settings: Any) -> Episodes:
    started = Episodes(pool, {"eval": [TASK]}, "counter", EpisodeSettings(**settings), BUNDLE.check_task)
    await started.start()
    return started


async def test_an_episode_seeds_plays_verifies_and_gives_its_instance_back() -> None:
    pool = FakePool()
    episodes = await runtime(pool)
    await episodes.seed("s1", None, TASK.id)
    reply = await episodes.call_tool("s1", "increment", {"by": 2})
    assert (reply.status, json.loads(reply.text)) == (200, {"count": 3})
    verdict = await episodes.verify("s1", "")
    assert (verdict.reward, verdict.failure) == (1.0, None)
    assert pool.releases == [(0, None)]
    await episodes.stop()


async def test_a_close_during_a_seed_waits_for_it_and_gives_the_instance_back_unbroken() -> None:
    pool = FakePool()
    gate = pool.instances[0].client.add_gate = Gate()
    episodes = await runtime(pool)
    seeding = asyncio.create_task(episodes.seed("s1", None, TASK.id))
    await gate.reached.wait()
    closing = asyncio.create_task(episodes.close("s1"))
    await asyncio.sleep(0.01)
    assert not closing.done(), "a close waits for the seed it races"
    gate.opened.set()
    seeded = await seeding
    await closing
    assert seeded.failure is not None
    assert seeded.failure.kind == "cancelled"
    assert pool.releases == [(0, "cancelled")]  # back in the pool, not sent to repair
    with pytest.raises(SessionConflictError, match="was closed"):
        await episodes.seed("s1", None, TASK.id)
    with pytest.raises(EpisodeStateError, match="closed"):
        await episodes.verify("s1", "")
    await episodes.stop()


async def test_a_verify_during_a_tool_call_grades_after_the_call_lands_and_refuses_new_calls() -> None:
    pool = FakePool()
    episodes = await runtime(pool)
    await episodes.seed("s1", None, TASK.id)
    gate = pool.instances[0].client.tool_gate = Gate()
    calling = asyncio.create_task(episodes.call_tool("s1", "increment", {"by": 2}))
    await gate.reached.wait()
    verifying = asyncio.create_task(episodes.verify("s1", ""))
    await asyncio.sleep(0.01)
    assert not verifying.done(), "the verify waits for the call in flight"
    late = await episodes.call_tool("s1", "increment", {"by": 5})
    assert (late.status, late.refused) == (409, True)
    assert pool.releases == [], "the instance is not reset under a running call"
    gate.opened.set()
    assert (await calling).status == 200
    verdict = await verifying
    assert (verdict.reward, verdict.failure) == (1.0, None)  # the call's +2 was graded
    assert pool.releases == [(0, None)]
    await episodes.stop()


async def test_an_episode_is_never_expired_while_a_tool_call_runs() -> None:
    pool = FakePool()
    episodes = await runtime(pool, idle_timeout_s=0.3)
    await episodes.seed("s1", None, TASK.id)
    gate = pool.instances[0].client.tool_gate = Gate()
    calling = asyncio.create_task(episodes.call_tool("s1", "increment", {"by": 2}))
    await gate.reached.wait()
    await asyncio.sleep(1.0)  # several sweeps, each past the idle timeout
    assert episodes.counters["expired"] == 0
    gate.opened.set()
    assert (await calling).status == 200
    await asyncio.sleep(1.0)  # now idle, and nothing runs
    assert episodes.counters["expired"] == 1
    verdict = await episodes.verify("s1", "")
    assert verdict.failure is not None
    assert verdict.failure.kind == "session_expired"
    assert pool.releases == [(0, "session_expired")]
    await episodes.stop()


async def test_a_call_that_outlives_its_episode_sends_the_instance_to_repair() -> None:
    pool = FakePool()
    episodes = await runtime(pool, tool_timeout_s=0.1)
    await episodes.seed("s1", None, TASK.id)
    gate = pool.instances[0].client.tool_gate = Gate()  # never opened: a tool past its own time limit
    calling = asyncio.create_task(episodes.call_tool("s1", "increment", {}))
    await gate.reached.wait()
    await episodes.close("s1")  # waits the call's limit plus a margin, then gives up on it
    assert pool.releases == [(0, "transport_timeout")]
    calling.cancel()
    await episodes.stop()


async def test_an_instance_that_drops_a_call_masks_the_episode_and_the_pool_hears_why() -> None:
    pool = FakePool()
    episodes = await runtime(pool)
    await episodes.seed("s1", None, TASK.id)
    pool.instances[0].client.tool_error = EnvDroppedError("the instance went away")
    reply = await episodes.call_tool("s1", "increment", {})
    assert (reply.status, reply.refused) == (503, True)
    with pytest.raises(SessionConflictError, match="episode failed"):  # not started over (by the model's own seed)
        await episodes.seed("s1", None, TASK.id)
    verdict = await episodes.verify("s1", "")
    assert verdict.failure is not None
    assert verdict.failure.kind == "transport_peer_drop"
    assert verdict.reward == 0.0
    assert pool.releases == [(0, "transport_peer_drop")]  # broken: the pool keeps it out of rotation
    await episodes.stop()


async def test_an_instance_that_dies_while_it_is_seeded_costs_no_episode() -> None:
    """No tool call has been answered yet: the seed takes another instance, and the broken one goes to be replaced.
    A failure that does not break the instance (the environment refused the task) is not retried."""
    pool = FakePool(size=3)
    pool.instances[0].client.add_error = EnvDroppedError("the connection dropped mid-call")
    episodes = await runtime(pool)
    seeded = await episodes.seed("s1", None, TASK.id)
    assert seeded.failure is None
    assert (await episodes.call_tool("s1", "increment", {"by": 2})).status == 200
    assert (await episodes.verify("s1", "")).reward == 1.0
    assert pool.releases == [(0, "transport_peer_drop"), (1, None)]
    assert episodes.counters["seeds_moved"] == 1
    pool.instances[2].client.add_error = RuntimeError("the environment refused the task")  # the next one free
    refused = await episodes.seed("s2", None, TASK.id)
    assert refused.failure is not None
    assert refused.failure.kind == "agentenv:internal_error"
    assert pool.releases[-1] == (2, "agentenv:internal_error")
    await episodes.stop()


async def test_a_seed_with_no_instance_is_masked_and_leases_nothing() -> None:
    pool = FakePool(size=1)
    episodes = await runtime(pool)
    await episodes.seed("holder", None, TASK.id)
    starved = await episodes.seed("s2", None, TASK.id)
    assert starved.failure is not None
    assert starved.failure.kind == "provider_unavailable"
    # It has ended already, holding nothing: a drain must not wait for it (verifiers never verifies a rollout whose
    # seed failed), and its tool calls are refused as the environment's failure.
    assert episodes.open_episodes() == 1
    refused = await episodes.call_tool("s2", "increment", {})
    assert refused.status == 503
    assert refused.text.startswith("the environment is unavailable: seed: no instance free")
    verdict = await episodes.verify("s2", "")
    assert verdict.failure is not None
    assert verdict.failure.kind == "provider_unavailable"
    with pytest.raises(EpisodeStateError, match="already verified"):
        await episodes.verify("s2", "")
    assert pool.releases == []  # it never held an instance
    await episodes.stop()


async def test_a_second_verify_is_refused_with_the_first_verdict() -> None:
    pool = FakePool()
    episodes = await runtime(pool)
    await episodes.seed("s1", None, TASK.id)
    first = await episodes.verify("s1", "")
    with pytest.raises(EpisodeStateError) as refused:
        await episodes.verify("s1", "")
    assert refused.value.verdict == first
    assert first.reward == 0.0
    assert first.failure is None
    await episodes.stop()


async def test_shutdown_ends_open_episodes_masked_and_stops_the_pool() -> None:
    pool = FakePool(size=2)
    episodes = await runtime(pool)
    await episodes.seed("s1", None, TASK.id)
    await episodes.seed("s2", None, TASK.id)
    await episodes.stop()
    assert sorted(pool.releases) == [(0, "shutdown"), (1, "shutdown")]
    assert pool.stopped


async def test_a_server_written_for_another_environment_refuses_to_start() -> None:
    pool = FakePool()
    wrong = Episodes(pool, {"eval": [TASK]}, "gridsim", EpisodeSettings(), BUNDLE.check_task)
    with pytest.raises(Exception, match="written for 'gridsim'"):
        await wrong.start()
    assert pool.stopped


async def test_every_episode_ends_once_in_the_log_with_its_outcome(caplog: pytest.LogCaptureFixture) -> None:
    """Verified, closed, expired or cut by the shutdown: one end line each, however many calls came after."""
    caplog.set_level("INFO", logger="gymhost.episodes")
    pool = FakePool(size=4)
    episodes = await runtime(pool, idle_timeout_s=0.3)
    for key in ("verified", "closed", "expired", "cut"):
        await episodes.seed(key, None, TASK.id)
    await episodes.call_tool("verified", "increment", {"by": 2})
    await episodes.verify("verified", "")
    await episodes.close("closed")
    await episodes.close("closed")
    await episodes.call_tool("verified", "increment", {})  # after its end: refused, and no second end
    for _ in range(10):  # "cut" stays busy; "expired" goes idle past idle_timeout_s
        await episodes.call_tool("cut", "increment", {})
        await asyncio.sleep(0.1)
    await episodes.stop()
    ends = {record.session_id: (record.outcome, record.failure_kind, record.reward) for record in caplog.records}  # type: ignore[attr-defined]
    assert len(caplog.records) == 4
    assert ends == {
        "verified": ("rewarded", None, 1.0),
        "closed": ("closed", None, None),
        "expired": ("masked", "session_expired", None),
        "cut": ("masked", "shutdown", None),
    }
