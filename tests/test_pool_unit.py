"""The pool, the one owner of an instance's life, against a launcher of fakes: no process, no network.

What a seed sees of it: a lease on a clean slate, the backpressure of a full pool, growth on demand up to the
maximum, idle instances stopped down to the minimum, a dead or broken instance replaced before a seed takes it, and
a stop that takes everything down, leased instances included.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gymhost.environments._backend import Catalog, Instance
from gymhost.environments._errors import EnvUnavailableError, PoolExhaustedError, StartupError
from gymhost.environments._outcomes import TIMEOUT, Failure
from gymhost.environments._pool import Pool
from gymhost.environments._settings import PoolSettings

pytestmark = [pytest.mark.unit, pytest.mark.anyio]

TOOLS = ({"name": "look"}, {"name": "submit"})


class FakeClient:
    """An instance as the pool asks it: describes itself, clears, tells its state."""

    def __init__(self, index: int, name: str = "gridsim") -> None:
        self.base_url = f"fake://{index}"
        self.name = name
        self.clears = 0
        self.answers = True  # False: it stopped answering (as a dead process would)
        self.clear_error: Exception | None = None

    async def describe(self) -> Catalog:
        if not self.answers:
            raise EnvUnavailableError(f"{self.base_url} does not answer")
        return Catalog(self.name, TOOLS)

    async def hidden_tools(self, catalog: Catalog) -> set[str]:
        return {"submit"}

    async def clear(self) -> None:
        if not self.answers:
            raise EnvUnavailableError(f"{self.base_url} does not answer")
        if self.clear_error is not None:
            raise self.clear_error
        self.clears += 1

    async def state(self) -> Any:
        return {"clears": self.clears}

    async def aclose(self) -> None:
        pass


class FakeLauncher:
    """Makes instances of ``FakeClient``; an instance "exits" when the test sets its event."""

    description = "fake environment"
    confinement_level = "none"

    def __init__(self, *, owns_instances: bool = True, name: str = "gridsim") -> None:
        self.owns_instances = owns_instances
        self.name = name
        self.launched: list[Instance] = []
        self.stopped: list[Instance] = []
        self.exits: dict[int, asyncio.Event] = {}
        self.closed = False
        self.fail_next = 0

    async def launch(self, index: int, settings: PoolSettings) -> Instance:
        if self.fail_next:
            self.fail_next -= 1
            raise StartupError(f"instance {index} failed to start")
        instance = Instance(index=index, client=FakeClient(index, self.name))  # type: ignore[arg-type]
        self.exits[index] = asyncio.Event()
        self.launched.append(instance)
        return instance

    async def stop(self, instance: Instance, *, graceful: bool = True) -> None:
        self.stopped.append(instance)
        self.exits[instance.index].set()

    async def exited(self, instance: Instance) -> None:
        await self.exits[instance.index].wait()

    async def close(self) -> None:
        self.closed = True


def settings(**overrides: Any) -> PoolSettings:
    return PoolSettings(**{"lease_timeout_s": 2.0, "instance_idle_s": 60.0, **overrides})


async def until(check: Any, what: str) -> None:
    for _ in range(400):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(what)


async def test_a_lease_is_on_a_clean_slate_and_a_release_makes_the_instance_free_again() -> None:
    launcher = FakeLauncher()
    pool = Pool(launcher, 2, 2, settings())
    await pool.start()
    try:
        assert pool.catalog.name == "gridsim"
        assert pool.catalog.hidden == {"submit"}  # read once, from the first instance
        instance = await pool.lease()
        assert instance.leased
        assert instance.client.clears == 1  # type: ignore[attr-defined]  # its launcher did not reset it
        assert pool.status()["leased"] == 1
        await pool.release(instance, None)
        assert not instance.leased
        assert instance.client.clears == 2  # type: ignore[attr-defined]
        assert pool.status()["free"] == 2
        assert await pool.lease() is instance
        assert instance.client.clears == 2  # type: ignore[attr-defined]  # cleared once, as its episode ended
    finally:
        await pool.stop()
    assert launcher.closed
    assert sorted(i.index for i in launcher.stopped) == [0, 1]


async def test_a_full_pool_makes_a_seed_wait_then_tells_it_why_and_how_to_raise_the_limit() -> None:
    pool = Pool(FakeLauncher(), 1, 1, settings(lease_timeout_s=0.2))
    await pool.start()
    try:
        held = await pool.lease()
        with pytest.raises(PoolExhaustedError, match=r"raise source\.max_instances"):
            await pool.lease()
        waiting = asyncio.create_task(pool.lease())
        await until(lambda: pool.status()["waiting_seeds"] == 1, "the seed waits for a release")
        await pool.release(held, None)
        assert await waiting is held  # the release went to the seed that waited
    finally:
        await pool.stop()


async def test_it_grows_on_demand_to_its_maximum_and_shrinks_to_its_minimum_when_idle() -> None:
    launcher = FakeLauncher()
    pool = Pool(launcher, 1, 3, settings(instance_idle_s=0.3, lease_timeout_s=0.5))
    await pool.start()
    try:
        leased = [await pool.lease() for _ in range(3)]
        assert len(launcher.launched) == 3
        with pytest.raises(PoolExhaustedError):
            await pool.lease()  # the maximum: no fourth
        for instance in leased:
            await pool.release(instance, None)
        await until(lambda: len(pool.instances) == 1, "idle instances are stopped down to the minimum")
        assert pool.status()["counters"]["instances_stopped"] == 2
    finally:
        await pool.stop()


async def test_an_instance_that_exits_by_itself_is_replaced_before_a_seed_takes_it() -> None:
    launcher = FakeLauncher()
    pool = Pool(launcher, 2, 2, settings())
    await pool.start()
    try:
        launcher.exits[0].set()  # instance 0 ends by itself
        await until(lambda: len(launcher.launched) == 3, "a replacement is started")
        await until(lambda: len(pool.instances) == 2, "the replacement joins the pool")
        assert 0 not in [instance.index for instance in pool.instances]
        assert pool.status()["counters"]["instances_replaced"] == 1
    finally:
        await pool.stop()


async def test_an_episode_that_broke_its_instance_gives_back_a_replacement() -> None:
    launcher = FakeLauncher()
    pool = Pool(launcher, 1, 1, settings())
    await pool.start()
    try:
        broken = await pool.lease()
        await pool.release(broken, Failure(TIMEOUT, "a tool call did not end"))
        assert broken.retired
        fresh = await pool.lease()
        assert fresh is not broken
        assert fresh.index == 1
    finally:
        await pool.stop()


async def test_an_instance_at_a_url_is_cleared_as_it_is_leased_and_one_that_does_not_answer_is_passed_over() -> None:
    pool = Pool(FakeLauncher(owns_instances=False), 2, 2, settings())
    await pool.start()
    try:
        first, second = pool.instances
        second.client.answers = False  # type: ignore[attr-defined]  # the most recently freed is leased first
        instance = await pool.lease()
        assert instance is first
        assert first.client.clears == 1  # type: ignore[attr-defined]  # someone else may have used it
        assert not second.healthy  # out of rotation, probed until it answers
    finally:
        await pool.stop()


class FakeProcess:
    def __init__(self) -> None:
        self.pid = 0
        self.paused = self.killed = False

    def pause(self) -> bool:
        self.paused = True
        return True

    def exited_now(self) -> bool:
        return self.killed

    def kill(self) -> None:
        self.killed = True


class OneEpisode(FakeLauncher):
    """Instances with a process, each for one episode, whose starts the test holds back (``go``)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.go.set()

    async def launch(self, index: int, settings: PoolSettings) -> Instance:
        await self.go.wait()
        instance = await super().launch(index, settings)
        instance.process = FakeProcess()  # type: ignore[assignment]
        instance.one_episode = True
        return instance


async def a_seed_waiting_for_a_start(pool: Pool, launcher: OneEpisode) -> tuple[Instance, asyncio.Task[Instance]]:
    used = await pool.lease()
    launcher.go.clear()  # the next start takes its time
    seed = asyncio.create_task(pool.lease())
    await until(lambda: pool.status()["waiting_seeds"] == 1 and pool.status()["starting"], "a seed waits")
    return used, seed


async def test_an_instance_whose_episode_ended_while_seeds_wait_for_starts_is_paused_then_stopped() -> None:
    """Its exit would take CPU from the starts the seeds wait for (a cold batch's first episodes end as its last
    ones seed): it is paused, and stopped once no seed waits."""
    launcher = OneEpisode()
    pool = Pool(launcher, 1, 4, settings())
    await pool.start()
    try:
        used, seed = await a_seed_waiting_for_a_start(pool, launcher)
        await pool.release(used, None)
        await until(lambda: used.process.paused, "the used instance is paused")  # type: ignore[union-attr]
        assert used not in launcher.stopped
        assert pool.status()["stopping"] == 1
        launcher.go.set()
        assert (await seed) is not used
        await until(lambda: used in launcher.stopped, "stopped once no seed waits")
        assert pool.status()["stopping"] == 0
    finally:
        await pool.stop()


async def test_a_pool_at_its_minimum_stays_ready_while_an_ended_episodes_instance_is_replaced() -> None:
    """Each episode's instance is replaced as it ends: the replica stays ready for that start (it would leave its
    balancer at every episode's end); an instance that broke is not counted while its replacement starts."""
    launcher = OneEpisode()
    pool = Pool(launcher, 1, 4, settings())
    await pool.start()
    try:
        used = await pool.lease()
        launcher.go.clear()  # the replacement takes its time
        await pool.release(used, None)
        await until(lambda: pool.status()["starting"] == 1, "its replacement starting")
        assert pool.not_ready() is None
        launcher.go.set()
        await until(lambda: pool.status()["starting"] == 0, "the replacement is up")
        broken = await pool.lease()
        launcher.go.clear()
        await pool.release(broken, Failure(TIMEOUT, "it stopped answering"))
        await until(lambda: pool.status()["starting"] == 1, "its replacement starting")
        assert pool.not_ready() == "warming up: 0 of its minimum of 1 environment instances serving"
        launcher.go.set()
        await until(lambda: pool.not_ready() is None, "ready once the replacement is up")
    finally:
        await pool.stop()


async def test_a_broken_instance_is_stopped_at_once_even_while_seeds_wait() -> None:
    launcher = OneEpisode()
    pool = Pool(launcher, 1, 4, settings())
    await pool.start()
    try:
        used, seed = await a_seed_waiting_for_a_start(pool, launcher)
        await pool.release(used, Failure(TIMEOUT, "it stopped answering"))
        await until(lambda: used in launcher.stopped, "stopped at once")
        assert not used.process.paused  # type: ignore[union-attr]
        launcher.go.set()
        await seed
    finally:
        await pool.stop()


async def test_a_pool_stopped_while_an_instance_is_paused_stops_it() -> None:
    launcher = OneEpisode()
    pool = Pool(launcher, 1, 4, settings())
    await pool.start()
    used, seed = await a_seed_waiting_for_a_start(pool, launcher)
    await pool.release(used, None)
    await until(lambda: used.process.paused, "the used instance is paused")  # type: ignore[union-attr]
    await pool.stop()
    assert used in launcher.stopped
    assert used.process.killed  # type: ignore[union-attr]
    with pytest.raises(PoolExhaustedError):
        await seed


async def test_instances_at_urls_are_never_started_or_stopped_only_probed_until_they_answer() -> None:
    launcher = FakeLauncher(owns_instances=False)
    pool = Pool(launcher, 2, 8, settings(lease_timeout_s=0.2))
    assert pool.maximum == 2  # someone else's instances: as many as there are
    await pool.start()
    try:
        instance = await pool.lease()
        instance.client.answers = False  # type: ignore[attr-defined]
        await pool.release(instance, None)  # it did not clear: out of rotation, not stopped
        assert not instance.healthy
        assert not instance.retired
        assert launcher.stopped == []
        assert pool.not_ready() == "warming up: 1 of its minimum of 2 environment instances serving"
        instance.client.answers = True  # type: ignore[attr-defined]
        await until(lambda: instance.healthy, "it is back once it answers")
        assert pool.not_ready() is None
        assert len(launcher.launched) == 2
    finally:
        await pool.stop()


async def test_instances_of_another_environment_refuse_the_start() -> None:
    class Mixed(FakeLauncher):
        async def launch(self, index: int, settings: PoolSettings) -> Instance:
            instance = await super().launch(index, settings)
            instance.client.name = f"env-{index}"  # type: ignore[attr-defined]
            return instance

    launcher = Mixed()
    with pytest.raises(StartupError, match="the instances are not the same environment"):
        await Pool(launcher, 2, 2, settings()).start()
    assert len(launcher.stopped) == 2  # nothing left running
    assert launcher.closed


async def test_a_failed_start_while_growing_is_retried_and_counted() -> None:
    launcher = FakeLauncher()
    pool = Pool(launcher, 1, 2, settings(lease_timeout_s=5.0))
    await pool.start()
    try:
        held = await pool.lease()
        launcher.fail_next = 1
        second = await pool.lease()  # the first start fails; the pool tries again
        assert second is not held
        assert pool.status()["counters"]["start_failures"] == 1
    finally:
        await pool.stop()


async def test_a_stop_takes_every_instance_down_leased_ones_included_and_refuses_seeds() -> None:
    launcher = FakeLauncher()
    pool = Pool(launcher, 2, 2, settings(lease_timeout_s=30.0))
    await pool.start()
    leased = [await pool.lease(), await pool.lease()]
    waiting = asyncio.create_task(pool.lease())
    await until(lambda: pool.status()["waiting_seeds"] == 1, "a third seed waits")
    await pool.stop()
    with pytest.raises(PoolExhaustedError, match="shutting down"):
        await waiting
    assert sorted(instance.index for instance in launcher.stopped) == sorted(i.index for i in leased)
    with pytest.raises(PoolExhaustedError, match="shutting down"):
        await pool.lease()
