"""The pool of environment instances a written server plays episodes on.

An agentenv environment keeps its state per instance, and its data plane takes no session id, so one instance
hosts one episode at a time. The pool leases instances to episodes, resets them on release, and repairs the ones
that broke: a bundle instance is started again; an instance at a URL is probed until its card answers again. Until
then it is out of rotation, so one broken instance costs capacity, not correctness.

Where instances come from is a ``Launcher``:

- ``BundleLauncher``: one loopback process per instance (``_runner``). Each episode's environment is isolated in
  its own process, as the protocol intends, at the price of a process (tens of MB) per concurrent episode.
- ``InProcessLauncher``: instances of the environment class inside the server, each reached through an in-memory
  ASGI transport. Same protocol, same behaviour, no process per episode: the way to hold hundreds of episodes.
- ``UrlLauncher``: instances someone else runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.util
import inspect
import logging
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from .._entrypoint import own_siblings
from .._exceptions import GymhostError
from .._logging import fastmcp_leaves_logging_alone
from ._catalog import card_tools
from ._env_client import DataPlaneError, EnvClient, EnvUnavailableError

__all__ = [
    "ENTRY",
    "READY",
    "BundleLauncher",
    "InProcessLauncher",
    "Instance",
    "Pool",
    "PoolExhaustedError",
    "StartupError",
    "UrlLauncher",
    "load_environment_class",
]

logger = logging.getLogger("gymhost.agentenv")

ENTRY = "env.py"  # a bundle's environment module
READY = "gymhost-env-ready"  # the first line ``_runner`` prints: READY <port>
_STOP_GRACE_S = 5.0
_PROBE_INTERVAL_S = 1.0
_CONGESTION_LOG_EVERY_S = 10.0  # at most one warning this often while seeds time out waiting for an instance


class StartupError(GymhostError):
    """The pool could not bring its instances up, or they disagree about what environment they are."""


class PoolExhaustedError(GymhostError):
    """No instance became free within the lease timeout."""


@dataclass(eq=False)
class Instance:
    index: int
    client: EnvClient
    process: asyncio.subprocess.Process | None = None
    hosted: _Hosted | None = None
    leased: bool = False
    healthy: bool = True
    queued: bool = False  # in the pool's free queue, ready for the next lease
    episodes: int = 0

    @property
    def base_url(self) -> str:
        return self.client.base_url

    def status(self) -> dict[str, Any]:
        # "resetting": released, its reset still running, not yet free
        state = "leased" if self.leased else "repairing" if not self.healthy else "free" if self.queued else "resetting"
        pid = self.process.pid if self.process is not None else None
        return {"index": self.index, "url": self.base_url, "state": state, "episodes": self.episodes, "pid": pid}


@dataclass(eq=False)
class _Hosted:
    """An in-process instance's app, whose lifespan runs in a task of its own (an anyio task group must be left in
    the task that entered it, and instances are started and stopped from different tasks)."""

    task: asyncio.Task[None]
    stop: asyncio.Event


class Launcher(Protocol):
    """Brings instance ``index`` up (again) and takes it down."""

    description: str
    restarts: bool  # a broken instance is replaced (a bundle), or waited for (a URL)

    async def launch(self, index: int, data_timeout: float) -> Instance: ...

    async def stop(self, instance: Instance, *, graceful: bool = True) -> None:
        """Take it down; not ``graceful`` when it is broken, and a request stuck in it would only delay the end."""
        ...


def load_environment_class(bundle: Path) -> type[Any]:
    """The one concrete ``AgentEnvEnvironment`` subclass ``bundle/env.py`` defines, imported with the bundle
    folder importable (for its sibling modules) under a module name of its own."""
    from agentenv_protocol import AgentEnvEnvironment

    entry = bundle / ENTRY
    name = f"gymhost_bundle_env_{hashlib.sha1(str(entry).encode()).hexdigest()[:10]}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, entry)
        if spec is None or spec.loader is None:
            raise StartupError(f"{entry}: not an importable Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            # Its sibling modules are its own even when another bundle in this process has one of the same name.
            with own_siblings(bundle, name):
                spec.loader.exec_module(module)
        except Exception as error:
            del sys.modules[name]
            raise StartupError(f"{entry}: importing it failed: {error!r}") from error
    found = [
        value
        for value in vars(module).values()
        if inspect.isclass(value)
        and issubclass(value, AgentEnvEnvironment)
        and value is not AgentEnvEnvironment
        and value.__module__ == module.__name__
        and not inspect.isabstract(value)
    ]
    if len(found) != 1:
        names = ", ".join(sorted(cls.__name__ for cls in found)) or "none"
        raise StartupError(f"{entry}: expected one AgentEnvEnvironment subclass, found {names}")
    return found[0]


class UrlLauncher:
    """Instances someone else runs; gymhost only talks to them."""

    restarts = False

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = [url.rstrip("/") for url in urls]
        self.description = f"{len(self.urls)} environment URL(s)"

    async def launch(self, index: int, data_timeout: float) -> Instance:
        return Instance(index, EnvClient(self.urls[index], data_timeout=data_timeout))

    async def stop(self, instance: Instance, *, graceful: bool = True) -> None:
        await instance.client.aclose()


class InProcessLauncher:
    """Instances of the bundle's environment class inside this process, each its own app behind an in-memory ASGI
    transport: the same card, data plane and MCP endpoint as a process instance, without the process."""

    restarts = True

    def __init__(self, bundle: Path) -> None:
        self.bundle = bundle
        self.description = f"bundle {bundle} (in-process)"

    async def launch(self, index: int, data_timeout: float) -> Instance:
        environment_class = load_environment_class(self.bundle)
        if index == 0:
            _warn_about_blocking_handlers(environment_class)
        environment = environment_class()
        with fastmcp_leaves_logging_alone():
            app = environment.create_app().streamable_http_app()
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()
        task = asyncio.create_task(_host(app, started, stop), name=f"gymhost-env-instance-{index}")
        await started
        transport = httpx.ASGITransport(app=app)
        client = EnvClient(f"http://instance-{index}.in-process", transport=transport, data_timeout=data_timeout)
        return Instance(index, client, hosted=_Hosted(task, stop))

    async def stop(self, instance: Instance, *, graceful: bool = True) -> None:
        await instance.client.aclose()
        if instance.hosted is not None:
            instance.hosted.stop.set()
            try:
                await asyncio.wait_for(asyncio.shield(instance.hosted.task), _STOP_GRACE_S if graceful else 0.1)
            except TimeoutError:
                instance.hosted.task.cancel()
            except Exception as error:
                logger.warning("in-process environment instance %s stopped with %r", instance.index, error)


def _warn_about_blocking_handlers(environment_class: type[Any]) -> None:
    """In-process, a handler that is not ``async`` runs on the server's event loop: while it runs, every episode
    and every request waits, and no timeout can interrupt it. Process mode has no such limit."""
    blocking = sorted(
        name
        for name, member in inspect.getmembers(environment_class, inspect.isfunction)
        if any(hasattr(member, marker) for marker in ("_aee_tool", "_aee_op", "_aee_ext"))
        and not inspect.iscoroutinefunction(member)
    )
    if blocking:
        logger.warning(
            "%s: %s are not async; in-process instances run them on the server's event loop, where they block "
            "every other episode while they run (process mode does not)",
            environment_class.__name__,
            ", ".join(blocking),
        )


async def _host(app: Any, started: asyncio.Future[None], stop: asyncio.Event) -> None:
    try:
        async with app.router.lifespan_context(app):
            started.set_result(None)
            await stop.wait()
    except BaseException as error:
        if started.done():
            raise
        started.set_exception(StartupError(f"an in-process environment instance did not start: {error!r}"))


class BundleLauncher:
    """One loopback process per instance, running the bundle's environment through ``_runner``."""

    restarts = True

    def __init__(self, bundle: Path, startup_timeout: float) -> None:
        self.bundle = bundle
        self.startup_timeout = startup_timeout
        self.description = f"bundle {bundle}"

    async def launch(self, index: int, data_timeout: float) -> Instance:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gymhost.agentenv._runner",
            str(self.bundle),
            stdin=asyncio.subprocess.PIPE,  # the death pipe: never written, closed when this process goes
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert process.stdout is not None
        try:
            line = await asyncio.wait_for(process.stdout.readline(), self.startup_timeout)
        except TimeoutError:
            await _terminate(process)
            raise StartupError(
                f"{self.bundle}/env.py: instance {index} did not start within {self.startup_timeout:g}s"
            ) from None
        except BaseException:  # cancelled while it starts: it must not outlive us
            _kill_now(process)
            raise
        words = line.decode(errors="replace").split()
        if len(words) != 2 or words[0] != READY:
            await _terminate(process)
            raise StartupError(
                f"{self.bundle}/env.py: instance {index} exited with status {process.returncode} before serving "
                "(its error output is above)"
            )
        return Instance(index, EnvClient(f"http://127.0.0.1:{words[1]}", data_timeout=data_timeout), process)

    async def stop(self, instance: Instance, *, graceful: bool = True) -> None:
        await instance.client.aclose()
        if instance.process is not None:
            if not graceful:
                _kill_now(instance.process)
            await _terminate(instance.process)


def _kill_now(process: asyncio.subprocess.Process) -> None:
    """No await, so it also works in a task that is being cancelled; the exited process is reaped by asyncio."""
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    if process.stdin is not None:
        process.stdin.close()


async def _terminate(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), _STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    if process.stdin is not None:
        process.stdin.close()


@dataclass
class Pool:
    launcher: Launcher
    size: int
    lease_timeout: float = 60.0
    data_timeout: float = 30.0
    startup_timeout: float = 60.0
    instances: list[Instance] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._free: asyncio.Queue[Instance] = asyncio.Queue()
        self._repairs: set[asyncio.Task[None]] = set()
        self._stopping = False
        self.waiting = 0  # seeds waiting for an instance right now
        self.lease_timeouts = 0
        self.replaced = 0  # instances brought back after they broke
        self._timeouts_unlogged = 0
        self._congestion_logged_at = float("-inf")

    async def start(self) -> dict[str, Any]:
        """Bring every instance up and check their cards agree; answers the card."""
        results = await asyncio.gather(*(self._bring_up(index) for index in range(self.size)), return_exceptions=True)
        self.instances = [result for result in results if isinstance(result, Instance)]
        failures = [result for result in results if isinstance(result, BaseException)]
        if failures:
            await self.stop()
            raise failures[0] if isinstance(failures[0], GymhostError) else StartupError(repr(failures[0]))
        try:
            cards = await asyncio.gather(*(instance.client.card() for instance in self.instances))
        except BaseException:
            await self.stop()
            raise
        names = {card["name"] for card in cards}
        tools = {tuple(sorted(tool.get("name", "") for tool in card_tools(card))) for card in cards}
        if len(names) > 1 or len(tools) > 1:
            await self.stop()
            raise StartupError(
                f"{self.launcher.description}: the instances are not the same environment "
                f"(names {sorted(names)}, tool sets {sorted(tools)})"
            )
        for instance in self.instances:
            self._make_free(instance)
        logger.info(
            "%s: %d instance(s) up; a seed waits at most %gs for a free one (lease_timeout_s)",
            self.launcher.description,
            self.size,
            self.lease_timeout,
        )
        return cards[0]

    async def lease(self) -> Instance:
        """A free instance, waiting up to ``lease_timeout`` for one: the backpressure a full pool puts on seeds."""
        if self._stopping:
            raise PoolExhaustedError("the server is shutting down")
        self.waiting += 1
        try:
            instance = await asyncio.wait_for(self._free.get(), self.lease_timeout)
        except TimeoutError:
            self._count_timeout()
            raise PoolExhaustedError(
                f"no environment instance became free within lease_timeout_s={self.lease_timeout:g}s: all "
                f"{self.size} instances (source.instances) are in episodes or being repaired, and {self.waiting - 1} "
                "other seeds are waiting; retry later, or raise source.instances"
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
                self.lease_timeout,
                self.size,
                sum(instance.leased for instance in self.instances),
                sum(not instance.healthy for instance in self.instances),
                self.waiting - 1,
            )
            self._timeouts_unlogged, self._congestion_logged_at = 0, now

    async def release(self, instance: Instance, *, healthy: bool) -> None:
        """Reset the instance and make it free again; one that failed or will not reset goes to repair.

        Whatever happens, even cancellation, the instance ends up free or in repair, never lost to the pool.
        """
        instance.leased = False
        if not healthy:
            self._send_to_repair(instance)
            return
        try:
            # Also while the pool stops: an instance at a URL outlives this server, and must not keep the episode.
            await instance.client.reset()
        except Exception as error:  # whatever an instance answers, it goes to repair and the caller goes on
            self._send_to_repair(instance)
            logger.warning("environment instance %s did not reset after its episode: %r", instance.index, error)
        except BaseException:  # cancelled: the instance is not lost, and the cancellation goes on
            self._send_to_repair(instance)
            raise
        else:
            if not self._stopping:
                self._make_free(instance)

    def _make_free(self, instance: Instance) -> None:
        instance.queued = True
        self._free.put_nowait(instance)

    def begin_stop(self) -> None:
        """From now on nothing is repaired or leased: the pool is going away."""
        self._stopping = True

    def _send_to_repair(self, instance: Instance) -> None:
        instance.healthy = False
        if not self._stopping:
            repair = asyncio.create_task(self._repair(instance), name=f"repair-instance-{instance.index}")
            self._repairs.add(repair)
            repair.add_done_callback(self._repairs.discard)

    def status(self) -> dict[str, Any]:
        instances = [instance.status() for instance in self.instances]
        states = [instance["state"] for instance in instances]
        return {
            "instances": instances,
            "free": self._free.qsize(),
            "leased": states.count("leased"),
            "resetting": states.count("resetting"),
            "repairing": states.count("repairing"),
            "waiting_seeds": self.waiting,
            "lease_timeouts": self.lease_timeouts,
            "instances_replaced": self.replaced,
        }

    async def stop(self) -> None:
        self.begin_stop()
        for repair in list(self._repairs):
            repair.cancel()
        await asyncio.gather(*self._repairs, return_exceptions=True)
        await asyncio.gather(*(self.launcher.stop(instance) for instance in self.instances), return_exceptions=True)

    async def _bring_up(self, index: int) -> Instance:
        instance = await self.launcher.launch(index, self.data_timeout)
        try:
            await self._wait_for_card(instance, self.startup_timeout)
        except BaseException:
            await self.launcher.stop(instance)
            raise
        return instance

    async def _wait_for_card(self, instance: Instance, timeout: float) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
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
