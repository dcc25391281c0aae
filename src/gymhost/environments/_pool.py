"""The pool of environment instances a written server plays episodes on: the one owner of an instance's lifecycle.

An environment instance keeps the state of the episode it hosts (an agentenv data plane takes no session id), so
one instance hosts one episode at a time. The pool brings instances up (through its ``Launcher``, ``_backend``),
reads the catalog they share, leases them out on a clean slate and answering, and takes them back after an episode.
Whether an episode's end broke its instance is the pool's call (``_outcomes.breaks_instance``); the episode only says
how it ended.

It is elastic between a minimum and a maximum: a seed that finds no free instance starts one (a bounded number at a
time) instead of waiting for a release, and instances free for longer than ``instance_idle_s`` are stopped, down to
the minimum. It heals before anyone notices: an instance that exits is noticed when it exits (the launcher watches
its process or task) and replaced, so a seed never takes a dead one; one that breaks in an episode is replaced when
the episode gives it back. Instances at URLs are someone else's: the pool neither starts nor stops them, and one that
stops answering is out of rotation until it answers again. An instance that serves one episode only (a process
instance, fresh for each: ``Instance.one_episode``) is replaced when its episode gives it back, never cleared.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any

from .._confinement import LIMIT_KINDS
from .._exceptions import GymhostError
from .._metrics import EpisodeMetrics
from ._backend import Catalog, Instance, Launcher
from ._counters import Counters
from ._errors import DataPlaneError, EnvUnavailableError, PoolExhaustedError, StartupError
from ._outcomes import Failure, breaks_instance, classify
from ._settings import PoolSettings

__all__ = ["Pool"]

logger = logging.getLogger("gymhost.environments")

_PROBE_INTERVAL_S = 1.0  # how often a broken URL instance is asked whether it answers
_URL_CHECK_EVERY_S = 5.0  # how often a free URL instance is asked, so one that went quiet is out before a seed
_START_RETRY_S = 1.0  # after a failed start, before the pool tries again
_LIMITS = {kind: limit for limit, kind in LIMIT_KINDS.items()}  # an instance's stop, by the limit it reached
_STOP_DEFERRED_S = 5.0  # the longest a retired instance waits, paused, for the seeds waiting on starts to be served
_PAUSED_AT_MOST = 64  # retired instances paused at once, beyond the pool's maximum: their memory is still theirs


class Pool:
    def __init__(
        self,
        launcher: Launcher,
        minimum: int,
        maximum: int,
        settings: PoolSettings,
        metrics: EpisodeMetrics | None = None,
    ) -> None:
        self.launcher = launcher
        self.metrics = metrics if metrics is not None else EpisodeMetrics()
        self.minimum = minimum
        self.maximum = maximum if launcher.owns_instances else minimum
        self.settings = settings
        self.instances: list[Instance] = []
        self.catalog = Catalog("")  # what the environment offers, hidden tools included, once started
        self.counters = Counters(
            (
                "lease_timeouts",
                "instances_started",
                "instances_stopped",
                "instances_replaced",
                "instances_renewed",
                "start_failures",
            ),
            logger,
        )
        self._retired_leased: set[Instance] = set()  # retired while an episode held them: stopped on release
        self._being_stopped: set[Instance] = set()  # retired and not leased: being stopped (``_stop_retired``)
        self._free: deque[Instance] = deque()  # the most recently freed last: it is leased first, the others age
        self._waiters: deque[asyncio.Future[Instance]] = deque()
        self._no_waiters: asyncio.Future[None] | None = None  # set when the last waiting seed is served
        self._starting = 0  # starts asked for and not yet done, queued for a startup slot or launching
        self._renewals = 0  # instances that served their one episode whose replacements have not started yet
        self._stopping_now = 0
        self._paused = 0
        self._startup_slots = asyncio.Semaphore(settings.parallel_startups)
        self._next_index = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping = False

    # -- lifecycle ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bring the minimum up, check they are one environment, read its catalog and hidden tools, then keep the pool:
        grow on demand, shrink when idle, replace what dies."""
        results = await asyncio.gather(*(self._bring_up() for _ in range(self.minimum)), return_exceptions=True)
        self.instances = [result for result in results if isinstance(result, Instance)]
        failures = [result for result in results if isinstance(result, BaseException)]
        if failures:
            await self.stop()
            raise failures[0] if isinstance(failures[0], GymhostError) else StartupError(repr(failures[0]))
        try:
            catalogs = await asyncio.gather(*(instance.client.describe() for instance in self.instances))
            if len({catalog.identity for catalog in catalogs}) > 1:
                raise StartupError(
                    f"{self.launcher.description}: the instances are not the same environment "
                    f"(names and tool sets {sorted({catalog.identity for catalog in catalogs})})"
                )
            hidden = await self.instances[0].client.hidden_tools(catalogs[0])
            self.instances[0].cleared = False  # that opened a session on it: the environment's code ran
        except BaseException:
            await self.stop()
            raise
        self.catalog = catalogs[0].with_hidden(hidden)
        self.counters["instances_started"] += len(self.instances)
        for instance in self.instances:
            self._watch(instance)
            self._hand(instance)
        self._background(self._maintain(), "gymhost-pool-maintenance")
        logger.info(
            "%s: %d instance(s) up, up to %d on demand; a seed waits at most %gs for one (lease_timeout_s)",
            self.launcher.description,
            len(self.instances),
            self.maximum,
            self.settings.lease_timeout_s,
        )

    def begin_stop(self) -> None:
        """From now on nothing is started, repaired or leased: the pool is going away."""
        self._stopping = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(PoolExhaustedError("the server is shutting down"))
        self._waiters_changed()

    async def stop(self) -> None:
        self.begin_stop()
        being_stopped = list(self._being_stopped)  # their stops are cancelled below: stopped here instead
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        remaining = [*self.instances, *self._retired_leased, *being_stopped]
        for instance in remaining:
            instance.retired = True
        await asyncio.gather(*(self.launcher.stop(instance) for instance in remaining), return_exceptions=True)
        await self.launcher.close()

    # -- leasing ------------------------------------------------------------------------------------------------

    def lease_deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.settings.lease_timeout_s

    async def lease(self, deadline: float | None = None) -> Instance:
        """An instance on a clean slate, waiting up to ``lease_timeout_s`` for one (started on demand, up to the
        maximum), or until ``deadline`` (``lease_deadline``): the backpressure a full pool puts on seeds.

        An instance this pool started that is cleared already (one that reset itself as it started, or one cleared
        as its last episode gave it back) is leased as it is: one whose process has exited is passed over (its
        launcher's watch retires it too), and one that dies under the seed is replaced by the seed (``Episodes``).
        Any other is cleared here (an instance at a URL, which others may reach, always is): one that does not answer
        its clearing is replaced and the lease takes another, so a fault between episodes costs no episode; one that
        answers it with something else than success is released as that failure says, and the error raised.
        """
        deadline = self.lease_deadline() if deadline is None else deadline
        while True:
            instance = await self._take(deadline)
            if instance.process is not None and instance.process.exited_now():  # died free; its watch not yet run
                instance.leased = False
                self._retire(instance)
                continue
            cleared, instance.cleared = instance.cleared, False  # leased: its episode's from now on
            if cleared and self.launcher.owns_instances:
                return instance
            try:
                await instance.client.clear()
            except EnvUnavailableError as error:
                logger.warning("environment instance %s did not answer: %s; leasing another", instance.index, error)
                self._retire(instance)
                continue
            except Exception as error:
                await self.release(instance, classify(error, stage="seed"))
                raise
            except BaseException:  # cancelled: the instance is not lost, and the cancellation goes on
                self._retire(instance)
                raise
            return instance

    async def release(self, instance: Instance, failure: Failure | None) -> None:
        """Take the instance back after an episode that ended with ``failure`` (None: it ended well).

        One the failure broke, or that died meanwhile, is replaced; any other is cleared and made free again, or
        replaced when it will not clear. Whatever happens, even cancellation, it ends up free or retired, never lost.
        """
        instance.leased = False
        if instance.retired:
            if instance in self._retired_leased:
                self._retired_leased.discard(instance)
                self._background(self.launcher.stop(instance, graceful=False), "gymhost-instance-stop")
            return
        if breaks_instance(failure) or not instance.healthy:
            self._retire(instance)
            return
        if instance.one_episode:
            self._retire(instance, renewed=True)
            return
        try:
            # Also while the pool stops: an instance at a URL outlives this server, and must not keep the episode.
            await instance.client.clear()
        except Exception as error:  # whatever an instance answers, it is replaced and the caller goes on
            logger.warning("environment instance %s did not clear after its episode: %r", instance.index, error)
            self._retire(instance)
        except BaseException:
            self._retire(instance)
            raise
        else:
            instance.cleared = True
            if not self._stopping and not instance.retired:
                self._hand(instance)

    async def _take(self, deadline: float) -> Instance:
        if self._stopping:
            raise PoolExhaustedError("the server is shutting down")
        if self._free:
            instance = self._free.pop()
            instance.queued = False
            self._lend(instance)
            return instance
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Instance] = loop.create_future()
        self._waiters.append(waiter)
        self._grow()
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), max(0.0, deadline - loop.time()))
        except TimeoutError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                return waiter.result()  # handed over in the same instant
            waiter.cancel()
            self.counters.warn("lease_timeouts", self._exhausted_message())
            raise PoolExhaustedError(self._exhausted_message()) from None
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._hand(waiter.result())  # cancelled after it was handed one: it goes to the next seed
            waiter.cancel()
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            self._waiters_changed()

    def _lend(self, instance: Instance) -> None:
        instance.leased = True
        instance.episodes += 1

    def _hand(self, instance: Instance) -> None:
        """A free instance goes to the seed that has waited longest, or to the free list."""
        instance.free_since = asyncio.get_running_loop().time()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._lend(instance)
                waiter.set_result(instance)
                self._waiters_changed()
                return
        self._waiters_changed()
        instance.queued = True
        self._free.append(instance)

    def _waiters_changed(self) -> None:
        if not self._waiters and self._no_waiters is not None and not self._no_waiters.done():
            self._no_waiters.set_result(None)

    async def _seeds_served(self, timeout: float) -> None:
        """Until no seed waits for an instance, or ``timeout``."""
        if not self._waiters:
            return
        if self._no_waiters is None or self._no_waiters.done():
            self._no_waiters = asyncio.get_running_loop().create_future()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._no_waiters), timeout)

    def _exhausted_message(self) -> str:
        waiting = max(0, len(self._waiters) - 1)
        if self.launcher.owns_instances:
            limit = (
                f"all {self.maximum} instances (the maximum, source.max_instances) are in episodes or being "
                f"replaced, and {waiting} other seeds are waiting; retry later, or raise source.max_instances "
                f"(gymhost serve FOLDER --set source.max_instances=N)"
            )
        else:
            limit = (
                f"all {len(self.instances)} environment URLs (source.urls) are in episodes or not answering, and "
                f"{waiting} other seeds are waiting; retry later, or add instances to source.urls"
            )
        return f"no environment instance became free within lease_timeout_s={self.settings.lease_timeout_s:g}s: {limit}"

    # -- growing, shrinking, healing --------------------------------------------------------------------------------

    def _healthy(self) -> int:
        return sum(instance.healthy and not instance.retired for instance in self.instances)

    def _grow(self, renewing: int = 0) -> None:
        """Start instances for the seeds waiting that no start already covers, up to the maximum; keep the minimum
        up; and start ``renewing`` more at once, for instances that served their one episode: the next seed finds
        the fresh one ready instead of waiting for its start."""
        if self._stopping or not self.launcher.owns_instances:
            return
        wanted = max(len(self._waiters) - self._starting, self.minimum - self._healthy() - self._starting, renewing)
        room = self.maximum - self._healthy() - self._starting
        for _ in range(min(wanted, room)):
            self._starting += 1
            self._background(self._start_one(), "gymhost-instance-start")

    async def _start_one(self) -> None:
        try:
            instance = await self._bring_up()
        except Exception as error:
            self._starting -= 1
            self._renewals = max(0, self._renewals - 1)
            self.counters.warn("start_failures", f"an environment instance did not start: {error}")
            if not self._stopping:
                await asyncio.sleep(_START_RETRY_S)
                self._grow()
            return
        except BaseException:
            self._starting -= 1
            raise
        self._starting -= 1
        self._renewals = max(0, self._renewals - 1)
        if self._stopping:
            instance.retired = True
            await self.launcher.stop(instance)
            return
        self.instances.append(instance)
        self.counters["instances_started"] += 1
        self._watch(instance)
        self._hand(instance)  # should a release have come first, the idle check stops the extra one later

    async def _bring_up(self) -> Instance:
        """Launch one instance (a bounded number at a time) and wait until it describes the pool's environment."""
        async with self._startup_slots:
            index, self._next_index = self._next_index, self._next_index + 1
            instance = await self.launcher.launch(index, self.settings)
            try:
                catalog = await self._wait_for_catalog(instance)
                if self.catalog.name and catalog.identity != self.catalog.identity:
                    raise StartupError(
                        f"environment instance {index} is {catalog.identity}, not the pool's {self.catalog.identity}"
                    )
            except BaseException:
                instance.retired = True
                await self.launcher.stop(instance, graceful=False)
                raise
            return instance

    async def _wait_for_catalog(self, instance: Instance) -> Catalog:
        deadline = asyncio.get_running_loop().time() + self.settings.startup_timeout_s
        while True:
            try:
                return await instance.client.describe()
            except (EnvUnavailableError, DataPlaneError) as error:
                if instance.process is not None and instance.process.exited_now():
                    raise StartupError(
                        f"environment instance {instance.index} exited before serving (what it printed is logged, by "
                        "gymhost.hosted)"
                    ) from None
                if asyncio.get_running_loop().time() > deadline:
                    raise StartupError(f"environment instance {instance.index}: it did not answer: {error}") from None
                await asyncio.sleep(0.05)

    def _watch(self, instance: Instance) -> None:
        async def watch() -> None:
            said = await self.launcher.exited(instance)
            limit = _LIMITS.get(said.kind) if said is not None else None
            if said is not None and limit is not None:  # counted even when the pool had retired it meanwhile
                logger.warning("environment instance %s: %s; replacing it", instance.index, said.reason)
                self.metrics.instance_stopped(limit)
            if not instance.retired and not self._stopping:
                if limit is None:
                    logger.warning("environment instance %s ended by itself; replacing it", instance.index)
                    self.metrics.instance_stopped("exited")
                self._retire(instance)

        self._background(watch(), f"gymhost-instance-{instance.index}-watch")

    def _retire(self, instance: Instance, *, renewed: bool = False) -> None:
        """Out of rotation at once: an instance the launcher owns is stopped and replaced as needed; one at a URL is
        probed until it answers again. An episode still holding it finds out on its next call. ``renewed``: it
        served its one episode (counted apart from the broken ones)."""
        if instance.retired or self._stopping:
            instance.healthy = False
            return
        if instance.queued:
            instance.queued = False
            with contextlib.suppress(ValueError):
                self._free.remove(instance)
        instance.healthy = False
        if not self.launcher.owns_instances:
            self._background(self._probe_until_back(instance), f"gymhost-instance-{instance.index}-probe")
            return
        instance.retired = True
        self.instances.remove(instance)
        self.counters["instances_renewed" if renewed else "instances_replaced"] += 1
        if instance.leased:
            # Its episode learns of it on its next call, as an unreachable environment; closing the client under
            # the episode would turn that into an error of gymhost's own.
            self._retired_leased.add(instance)
        else:
            self._being_stopped.add(instance)
            self._background(self._stop_retired(instance, renewed), f"gymhost-instance-{instance.index}-stop")
        self._renewals += renewed
        self._grow(renewing=1 if renewed else 0)

    async def _stop_retired(self, instance: Instance, renewed: bool) -> None:
        """Stop an instance taken out of rotation. One that served its episode (``renewed``) while seeds wait for
        starts (a batch landing on the pool) is paused at once and stopped once no seed waits, at most
        ``_STOP_DEFERRED_S`` later and no more than ``_PAUSED_AT_MOST`` at a time: a process's exit (its memory freed,
        its namespaces torn down) takes CPU those starts need, and a cold batch's last episodes to seed wait behind
        its first ones' ends. A broken one is stopped at once."""
        self._stopping_now += 1
        try:
            pausing = renewed and self._waiters and self._starting and self._paused < _PAUSED_AT_MOST
            if pausing and instance.process is not None and instance.process.pause():
                self._paused += 1
                try:
                    await self._seeds_served(_STOP_DEFERRED_S)
                finally:
                    self._paused -= 1
            await self.launcher.stop(instance, graceful=False)
        except BaseException:
            if instance.process is not None:
                instance.process.kill()  # cancelled (the pool is stopping, and stops it): nothing is left paused
            raise
        finally:
            self._stopping_now -= 1
            self._being_stopped.discard(instance)

    async def _probe_until_back(self, broken: Instance) -> None:
        while not self._stopping:
            try:
                await broken.client.describe()
                await broken.client.clear()
            except Exception as error:  # whatever it answers, keep trying
                logger.warning("environment instance %s is still down: %r", broken.index, error)
                await asyncio.sleep(_PROBE_INTERVAL_S)
                continue
            broken.healthy = True
            self.counters["instances_replaced"] += 1
            logger.info("environment instance %s is back", broken.index)
            if not broken.leased:
                self._hand(broken)
            return

    async def _maintain(self) -> None:
        """Every so often: stop instances free for longer than ``instance_idle_s`` (the least recently used first,
        down to the minimum), and ask free URL instances to describe themselves, so one that went quiet is out of
        rotation before a seed takes it."""
        interval = max(0.25, min(_URL_CHECK_EVERY_S, self.settings.instance_idle_s / 4))
        checked_at = 0.0
        while True:
            await asyncio.sleep(interval)
            now = asyncio.get_running_loop().time()
            while (
                self.launcher.owns_instances
                and self._free
                and self._healthy() > self.minimum
                and now - self._free[0].free_since >= self.settings.instance_idle_s
            ):
                idle = self._free.popleft()
                idle.queued, idle.retired = False, True
                self.instances.remove(idle)
                self.counters["instances_stopped"] += 1
                self._background(self._stop_idle(idle), "gymhost-instance-stop")
            if not self.launcher.owns_instances and now - checked_at >= _URL_CHECK_EVERY_S:
                checked_at = now
                for instance in list(self._free):
                    self._background(self._check(instance), f"gymhost-instance-{instance.index}-check")
            self._grow()  # the minimum, should a start have failed

    async def _stop_idle(self, instance: Instance) -> None:
        self._stopping_now += 1
        try:
            await self.launcher.stop(instance)
        finally:
            self._stopping_now -= 1

    async def _check(self, instance: Instance) -> None:
        try:
            await instance.client.describe()
        except Exception as error:
            if instance.queued:
                logger.warning("environment instance %s stopped answering: %r", instance.index, error)
                self._retire(instance)

    def _background(self, work: Any, name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- what an operator sees -----------------------------------------------------------------------------------

    def not_ready(self) -> str | None:
        """Why the pool cannot take its share of episodes yet: fewer than its minimum of instances serving. An
        instance that served its one episode and is being replaced (``fresh_instances``) still counts until its
        replacement is up: a pool at its minimum would otherwise leave its balancer at every episode's end. One that
        died does not."""
        serving = self._healthy()
        if serving + min(self._starting, self._renewals) < self.minimum:
            return f"warming up: {serving} of its minimum of {self.minimum} environment instances serving"
        return None

    def status(self) -> dict[str, Any]:
        instances = [instance.status() for instance in self.instances]
        states = [instance["state"] for instance in instances]
        return {
            "limits": {
                "min_instances": self.minimum,
                "max_instances": self.maximum,
                "instance_idle_s": self.settings.instance_idle_s,
                "parallel_startups": self.settings.parallel_startups,
                "lease_timeout_s": self.settings.lease_timeout_s,
                "data_timeout_s": self.settings.data_timeout_s,
                "startup_timeout_s": self.settings.startup_timeout_s,
            },
            "confinement": self.launcher.confinement_level,
            "instances": instances,
            "free": len(self._free),
            "leased": states.count("leased"),
            "resetting": states.count("resetting"),
            "repairing": states.count("repairing"),
            "starting": self._starting,
            "stopping": self._stopping_now,
            "waiting_seeds": len(self._waiters),
            "counters": dict(self.counters),
        }

    async def instance_status(self, index: int) -> dict[str, Any] | None:
        """One instance's status and its state (agentenv's ``data/get``): how an operator (or a test) sees that a
        released instance was cleared, in-process instances included. None for no such instance."""
        instance = next((instance for instance in self.instances if instance.index == index), None)
        if instance is None:
            return None
        answer = instance.status()
        try:
            answer["data"] = await instance.client.state()
        except (GymhostError, RecursionError) as error:  # whatever the instance did: the view shows it, not a 500
            answer["data"], answer["error"] = None, str(error) or type(error).__name__
        return answer
