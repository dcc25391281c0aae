"""The pool of environment instances a written server plays episodes on: the one owner of an instance's lifecycle.

An agentenv environment keeps its state per instance, and its data plane takes no session id, so one instance
hosts one episode at a time. The pool brings instances up (through a ``Launcher``, ``_launchers``), reads the card
they share, leases them out reset and answering, takes them back after an episode, and repairs the ones that broke:
a bundle instance is started again; an instance at a URL is probed until its card answers again. Until then it is
out of rotation, so one broken instance costs capacity, not correctness. Whether an episode's end broke its
instance is the pool's call (``_outcomes.breaks_instance``); the episode only says how it ended.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .._exceptions import GymhostError
from ._catalog import card_tools
from ._config import PoolSettings
from ._exceptions import DataPlaneError, EnvUnavailableError, PoolExhaustedError, StartupError
from ._grading import merge_state
from ._launchers import Instance, Launcher
from ._outcomes import Failure, breaks_instance, classify

__all__ = ["Pool"]

logger = logging.getLogger("gymhost.agentenv")

_PROBE_INTERVAL_S = 1.0
_CONGESTION_LOG_EVERY_S = 10.0  # at most one warning this often while seeds time out waiting for an instance


class Pool:
    def __init__(self, launcher: Launcher, size: int, settings: PoolSettings) -> None:
        self.launcher = launcher
        self.size = size
        self.settings = settings
        self.instances: list[Instance] = []
        self.card: dict[str, Any] = {}  # the environment's card, once started
        self.hidden_tools: set[str] = set()  # tools its tools/list hides from models
        self.waiting = 0  # seeds waiting for an instance right now
        self.lease_timeouts = 0
        self.replaced = 0  # instances brought back after they broke
        self._free: asyncio.Queue[Instance] = asyncio.Queue()
        self._repairs: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._timeouts_unlogged = 0
        self._congestion_logged_at = float("-inf")

    # -- lifecycle ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bring every instance up, check they are one environment, and read its card and hidden tools."""
        results = await asyncio.gather(*(self._bring_up(index) for index in range(self.size)), return_exceptions=True)
        self.instances = [result for result in results if isinstance(result, Instance)]
        failures = [result for result in results if isinstance(result, BaseException)]
        if failures:
            await self.stop()
            raise failures[0] if isinstance(failures[0], GymhostError) else StartupError(repr(failures[0]))
        try:
            cards = await asyncio.gather(*(instance.client.card() for instance in self.instances))
            names = {card["name"] for card in cards}
            tools = {tuple(sorted(tool.get("name", "") for tool in card_tools(card))) for card in cards}
            if len(names) > 1 or len(tools) > 1:
                raise StartupError(
                    f"{self.launcher.description}: the instances are not the same environment "
                    f"(names {sorted(names)}, tool sets {sorted(tools)})"
                )
            self.hidden_tools = await self.instances[0].client.hidden_tools(cards[0])
        except BaseException:
            await self.stop()
            raise
        self.card = cards[0]
        for instance in self.instances:
            self._make_free(instance)
        logger.info(
            "%s: %d instance(s) up; a seed waits at most %gs for a free one (lease_timeout_s)",
            self.launcher.description,
            self.size,
            self.settings.lease_timeout_s,
        )

    def begin_stop(self) -> None:
        """From now on nothing is repaired or leased: the pool is going away."""
        self._stopping = True

    async def stop(self) -> None:
        self.begin_stop()
        for repair in list(self._repairs):
            repair.cancel()
        await asyncio.gather(*self._repairs, return_exceptions=True)
        await asyncio.gather(*(self.launcher.stop(instance) for instance in self.instances), return_exceptions=True)

    # -- leasing ------------------------------------------------------------------------------------------------

    async def lease(self) -> Instance:
        """An instance that is reset and answering, waiting up to ``lease_timeout_s`` for a free one: the
        backpressure a full pool puts on seeds.

        One that died while it was free does not answer its reset: it goes to repair and the lease takes the next
        free one (or the repaired one), so a fault between episodes costs no episode. An instance that answers the
        reset with something else than success is released as that failure says, and the error raised.
        """
        for attempt in (1, 2):
            instance = await self._take()
            try:
                await instance.client.reset()
            except EnvUnavailableError as error:
                self._send_to_repair(instance)
                if attempt == 2:
                    raise
                logger.warning("environment instance %s did not answer: %s; leasing another", instance.index, error)
                continue
            except Exception as error:
                await self.release(instance, classify(error, stage="seed"))
                raise
            except BaseException:  # cancelled: the instance is not lost, and the cancellation goes on
                self._send_to_repair(instance)
                raise
            return instance
        raise AssertionError("unreachable")

    async def release(self, instance: Instance, failure: Failure | None) -> None:
        """Take the instance back after an episode that ended with ``failure`` (None: it ended well).

        An instance the failure broke goes to repair; any other is reset and made free again, or goes to repair
        when it will not reset. Whatever happens, even cancellation, it ends up free or in repair, never lost.
        """
        instance.leased = False
        if breaks_instance(failure):
            self._send_to_repair(instance)
            return
        try:
            # Also while the pool stops: an instance at a URL outlives this server, and must not keep the episode.
            await instance.client.reset()
        except Exception as error:  # whatever an instance answers, it goes to repair and the caller goes on
            self._send_to_repair(instance)
            logger.warning("environment instance %s did not reset after its episode: %r", instance.index, error)
        except BaseException:
            self._send_to_repair(instance)
            raise
        else:
            if not self._stopping:
                self._make_free(instance)

    async def _take(self) -> Instance:
        if self._stopping:
            raise PoolExhaustedError("the server is shutting down")
        self.waiting += 1
        try:
            instance = await asyncio.wait_for(self._free.get(), self.settings.lease_timeout_s)
        except TimeoutError:
            self._count_timeout()
            raise PoolExhaustedError(
                f"no environment instance became free within lease_timeout_s={self.settings.lease_timeout_s:g}s: "
                f"all {self.size} instances (source.instances) are in episodes or being repaired, and "
                f"{self.waiting - 1} other seeds are waiting; retry later, or raise source.instances"
            ) from None
        finally:
            self.waiting -= 1
        instance.queued = False
        instance.leased = True
        instance.episodes += 1
        return instance

    def _count_timeout(self) -> None:
        self.lease_timeouts += 1
        self._timeouts_unlogged += 1
        now = asyncio.get_running_loop().time()
        if now - self._congestion_logged_at >= _CONGESTION_LOG_EVERY_S:
            logger.warning(
                "%d seed(s) found no free environment instance within lease_timeout_s=%gs (pool of %d: %d leased, "
                "%d repairing; %d seeds waiting)",
                self._timeouts_unlogged,
                self.settings.lease_timeout_s,
                self.size,
                sum(instance.leased for instance in self.instances),
                sum(not instance.healthy for instance in self.instances),
                self.waiting - 1,
            )
            self._timeouts_unlogged, self._congestion_logged_at = 0, now

    def _make_free(self, instance: Instance) -> None:
        instance.queued = True
        self._free.put_nowait(instance)

    # -- what an operator sees -----------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        instances = [instance.status() for instance in self.instances]
        states = [instance["state"] for instance in instances]
        return {
            "limits": {
                "instances": self.size,
                "lease_timeout_s": self.settings.lease_timeout_s,
                "data_timeout_s": self.settings.data_timeout_s,
                "startup_timeout_s": self.settings.startup_timeout_s,
            },
            "instances": instances,
            "free": self._free.qsize(),
            "leased": states.count("leased"),
            "resetting": states.count("resetting"),
            "repairing": states.count("repairing"),
            "waiting_seeds": self.waiting,
            "lease_timeouts": self.lease_timeouts,
            "instances_replaced": self.replaced,
        }

    async def instance_status(self, index: int) -> dict[str, Any] | None:
        """One instance's status and its state as ``data/get`` answers it: how an operator (or a test) sees that a
        released instance was reset, in-process instances included. None for no such instance."""
        if not 0 <= index < len(self.instances):
            return None
        instance = self.instances[index]
        answer = instance.status()
        try:
            answer["data"] = merge_state(await instance.client.get())
        except (EnvUnavailableError, DataPlaneError) as error:
            answer["data"], answer["error"] = None, str(error)
        return answer

    # -- bringing instances up and back ----------------------------------------------------------------------------

    def _send_to_repair(self, instance: Instance) -> None:
        instance.healthy = False
        if not self._stopping:
            repair = asyncio.create_task(self._repair(instance), name=f"repair-instance-{instance.index}")
            self._repairs.add(repair)
            repair.add_done_callback(self._repairs.discard)

    async def _bring_up(self, index: int) -> Instance:
        instance = await self.launcher.launch(index, self.settings)
        try:
            await self._wait_for_card(instance)
        except BaseException:
            await self.launcher.stop(instance)
            raise
        return instance

    async def _wait_for_card(self, instance: Instance) -> None:
        deadline = asyncio.get_running_loop().time() + self.settings.startup_timeout_s
        while True:
            try:
                await instance.client.card()
                return
            except (EnvUnavailableError, DataPlaneError) as error:
                if asyncio.get_running_loop().time() > deadline:
                    raise StartupError(
                        f"environment instance {instance.index}: its card did not answer: {error}"
                    ) from None
                await asyncio.sleep(0.05)

    async def _repair(self, broken: Instance) -> None:
        """Bring the instance back: a new process for a bundle, a probe until the card answers for a URL."""
        while not self._stopping:
            try:
                if self.launcher.restarts:
                    await self.launcher.stop(broken, graceful=False)
                    fresh = await self._bring_up(broken.index)
                    fresh.episodes = broken.episodes
                    self.instances[self.instances.index(broken)] = fresh
                    broken = fresh
                else:
                    await broken.client.card()
                await broken.client.reset()
            except Exception as error:  # an environment's constructor can raise anything; keep trying
                logger.warning("environment instance %s is still down: %r", broken.index, error)
                await asyncio.sleep(_PROBE_INTERVAL_S)
                continue
            broken.healthy = True
            self.replaced += 1
            logger.info("environment instance %s is back", broken.index)
            self._make_free(broken)
            return
